"""The package zip a Kubernetes job's ConfigMap carries is compressed once per version of the
sources and kept in the user's cache; a changed file makes a new one."""

from __future__ import annotations

import io
import zipfile

from mpilaunch.runtime import image_tools


def test_package_zip_is_kept_until_a_file_changes(tmp_path, monkeypatch):
    pkg = tmp_path / "src" / "mpilaunch"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(image_tools, "package_files", lambda: [("mpilaunch/a.py", pkg / "a.py")])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = image_tools.package_zip()
    assert first == image_tools.zip_bytes()
    kept = list((tmp_path / "cache" / "mpilaunch" / "tools").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == first
    assert (tmp_path / "cache" / "mpilaunch" / "tools").stat().st_mode & 0o077 == 0
    kept[0].write_bytes(b"what the cache holds")  # read, not compressed again
    assert image_tools.package_zip() == b"what the cache holds"
    (pkg / "a.py").write_text("A = 22\n")  # another size: another key
    changed = image_tools.package_zip()
    assert zipfile.ZipFile(io.BytesIO(changed)).read("mpilaunch/a.py") == b"A = 22\n"
    assert [p.read_bytes() for p in (tmp_path / "cache" / "mpilaunch" / "tools").iterdir()] == [changed]


def test_package_zip_without_a_writable_cache_is_still_made(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: no directory can be made under it
    assert image_tools.package_zip() == image_tools.zip_bytes()
