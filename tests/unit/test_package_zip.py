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


def _import_from(zip_path, module: str, show: str) -> str:
    """``show.__file__`` after importing ``module`` from ``zip_path`` in a bare interpreter, as a pod does."""
    import subprocess
    import sys

    code = f"import sys; sys.path.insert(0, {str(zip_path)!r}); import {module}, {show}; print({show}.__file__)"
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, check=True, cwd="/")
    return out.stdout.strip()


def test_package_zip_carries_bytecode_that_a_pod_of_this_python_loads(tmp_path):
    """The pieces import the zip's bytecode (no compile of each module they import, every time they
    start) and the zip stays within what a ConfigMap holds (1 MiB)."""
    data = image_tools.zip_bytes()
    assert len(data) <= image_tools.BYTECODE_BUDGET < 1024 * 1024
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    assert {"mpilaunch/rank.py", "mpilaunch/rank.pyc", "mpilaunch/__init__.pyc"} <= names
    (tmp_path / "mpilaunch.zip").write_bytes(data)
    launcher = "mpilaunch.backends.k8s.in_cluster.launcher"
    assert _import_from(tmp_path / "mpilaunch.zip", launcher, "mpilaunch.workloads.mpirun").endswith(".pyc")
    assert _import_from(tmp_path / "mpilaunch.zip", "mpilaunch.rank", "mpilaunch.core.rank_env").endswith(".pyc")


def test_package_zip_bytecode_of_another_python_falls_back_to_the_sources(tmp_path):
    """A pod whose python3 is another version sees another magic number and compiles the source."""
    source = zipfile.ZipFile(io.BytesIO(image_tools.zip_bytes()))
    with zipfile.ZipFile(tmp_path / "mpilaunch.zip", "w") as z:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith(".pyc"):
                data = b"\x00\x00\r\n" + data[4:]  # no interpreter's magic number
            z.writestr(info, data)
    assert _import_from(tmp_path / "mpilaunch.zip", "mpilaunch.rank", "mpilaunch.rank").endswith("/mpilaunch/rank.py")


def test_package_zip_without_bytecode_when_asked(monkeypatch):
    monkeypatch.setenv("MPILAUNCH_TOOLS_BYTECODE", "0")
    assert not [n for n in zipfile.ZipFile(io.BytesIO(image_tools.zip_bytes())).namelist() if n.endswith(".pyc")]
