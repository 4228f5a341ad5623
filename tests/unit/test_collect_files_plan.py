"""--collect's pure rules (core/artifacts.py) and its transfer (runtime/artifacts.py) with the worker
side for real: the probe script runs under ``/bin/sh -c`` in a directory standing for a worker's,
and only the channel between the two (the agents, the exec API) is a pipe here. The whole path
through real agents, pods and YARN containers is tests/e2e/*/test_*collect_files*.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from mpilaunch.core import artifacts as plan
from mpilaunch.core import rank_lines
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import JobSpec
from mpilaunch.runtime import artifacts


def shell_in(directory):
    """A worker's ``capture(command, timeout)``: the command under /bin/sh, started in ``directory``."""

    def capture(command, timeout):
        done = subprocess.run(["/bin/sh", "-c", command], cwd=directory, capture_output=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr

    return capture


def spec(*globs, **kw) -> JobSpec:
    return JobSpec(command=("true",), collect=tuple(globs), **kw)


def test_collect_files_sizes_parse_and_print():
    assert [plan.parse_size("--collect-max", t) for t in ("4096", "100k", "512M", "1G", "1.5GiB", "2 MB")] == [
        4096,
        100 << 10,
        512 << 20,
        1 << 30,
        3 << 29,
        2 << 20,
    ]
    for bad in ("lots", "0", "-1G", "1X", "1Gx", ""):
        with pytest.raises(UsageError):
            plan.parse_size("--collect-max", bad)
    assert [plan.format_size(n) for n in (300, 12 << 10, 512 << 20, int(3.2 * (1 << 30)))] == [
        "300 B",
        "12 KiB",
        "512 MiB",
        "3.2 GiB",
    ]


def test_collect_files_caps_one_line_per_file_and_later_small_files_still_go():
    found = [
        plan.Found("w-1", "/x/big.bin", "big.bin", int(3.2 * (1 << 30))),
        plan.Found("w-0", "/x/a", "a", 600 << 20),
        plan.Found("w-0", "/x/b", "b", 500 << 20),
        plan.Found("w-0", "/x/c", "c", 100 << 20),
    ]
    choice = plan.choose(found, 1 << 30, 1 << 30)
    assert [f.name for f in choice.taken] == ["a", "c"]
    assert choice.skipped == (
        "skipped w-0:/x/b (500 MiB over the 1 GiB cap, 600 MiB collected before it)",
        "skipped w-1:/x/big.bin (3.2 GiB over the 1 GiB per-file cap)",
    )
    assert choice.bytes == 700 << 20


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "", ".", "a\0b", None])
def test_collect_files_a_workers_name_that_leaves_its_folder_is_refused(name):
    assert plan.safe_name(name) is None


def test_collect_files_spec_timeline_reaches_the_ranks_environment():
    assert spec(timeline="tl.json").env == ("HOROVOD_TIMELINE=tl.json",)
    assert spec(timeline="tl.json", env=("HOROVOD_TIMELINE=tl.json",)).env == ("HOROVOD_TIMELINE=tl.json",)
    with pytest.raises(UsageError):
        spec(timeline="tl.json", env=("HOROVOD_TIMELINE=other.json",))
    with pytest.raises(UsageError):
        spec(timeline="tl.json", mode="ps")
    with pytest.raises(UsageError):
        spec("")
    assert artifacts.globs_of(spec("a/*", timeline="t[1].json")) == ("a/*", "t[[]1].json")


def test_collect_files_a_file_bigger_than_a_piece_comes_back_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "PIECE_BYTES", 1000)
    worker = tmp_path.resolve() / "worker"
    (worker / "out" / "sub").mkdir(parents=True)
    data = bytes(range(256)) * 14  # 3584 B: four pieces
    (worker / "out" / "sub" / "big.bin").write_bytes(data)
    (worker / "out" / "empty").write_bytes(b"")
    (worker / "out" / "link").symlink_to(worker / "out" / "empty")  # inside: the same file, once
    (worker / "out" / "away").symlink_to(tmp_path)  # a link to a directory out of it: not entered
    (tmp_path / "secret").write_text("no")
    (worker / "out" / "secret").symlink_to(tmp_path / "secret")
    dest = tmp_path / "dest"
    context = tmp_path / "context.json"
    context.write_text(json.dumps({"workers": {"w-0": {}}, "probe_python": sys.executable}))
    monkeypatch.setattr(artifacts, "captures_of", lambda context, shared: {"w-0": shell_in(tmp_path)})
    err = io.StringIO()
    # the session starts elsewhere; the ranks ran in ``worker`` (their start lines said)
    summary = artifacts.collect(spec("out", "**/*.bin"), context, dest, err, False, {"w-0": str(worker)})
    assert err.getvalue().splitlines() == [
        f"mpilaunch: collect: skipped w-0:{worker}/out/away (a symbolic link out of {worker})",
        f"mpilaunch: collect: skipped w-0:{worker}/out/secret (a symbolic link out of {worker})",
    ]
    assert (dest / "w-0" / "out" / "sub" / "big.bin").read_bytes() == data
    assert (dest / "w-0" / "out" / "empty").read_bytes() == b""
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "w-0/out/empty",
        "w-0/out/sub/big.bin",
    ]
    assert (summary["files"], summary["bytes"], summary["skipped"]) == (2, len(data), 2)


def test_collect_files_a_hostile_listing_writes_nothing_out_of_its_folder(tmp_path, monkeypatch):
    """A worker answers with names of its own making: one leaving the worker's folder is a line."""
    listing = {"files": [{"path": "/x", "name": "../../escape", "size": 3}, {"path": "/y", "name": "ok", "size": 2}]}

    def capture(command, timeout):
        if " list " in command:
            return 0, json.dumps(listing).encode() + b"\n", b""
        return 0, b"\0" + (2).to_bytes(8, "big") + b"hi", b""

    context = tmp_path / "context.json"
    context.write_text("{}")
    monkeypatch.setattr(artifacts, "captures_of", lambda context, shared: {"w-0": capture})
    err = io.StringIO()
    summary = artifacts.collect(spec("*"), context, tmp_path / "dest", err, shared_host=False)
    assert err.getvalue().splitlines() == ["mpilaunch: collect: skipped w-0:/x (its name or size is not usable here)"]
    assert not (tmp_path / "escape").exists()
    assert (tmp_path / "dest" / "w-0" / "ok").read_bytes() == b"hi"
    assert summary["files"] == 1


def test_collect_files_rank_start_line_says_where_the_rank_runs():
    """Relative globs start where the ranks ran: MPI chooses that directory (mpirun's, where the
    worker has it), so the rank wrapper's start line says it; a wrapper that did not: None."""
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    env["MPILAUNCH_WORKER"] = "j-worker-0"
    line = rank_lines.format_start(env, "/bin/x", "ab12", cwd="/work/my dir")
    assert rank_lines.parse_start_cwd("[1,1]<stderr>:" + line, "ab12") == "/work/my dir"
    assert rank_lines.parse_start(line, "ab12")[:4] == (1, 1, 2, "j-worker-0")
    assert rank_lines.parse_start_env(line, "ab12") == ("/bin/x", rank_lines.parse_start_env(line)[1])
    older = rank_lines.format_start(env, "/bin/x", "ab12")
    assert rank_lines.parse_start_cwd(older, "ab12") is None
    assert rank_lines.parse_start(older, "ab12")[:4] == (1, 1, 2, "j-worker-0")
