"""The stacks probe's native pass (hang/probe.py add_native_frames): one rank per Python stack is
dumped with ``py-spy --native`` and its frames given to its group. Under load such a dump can come back
as one unnamed address and no Python frame; the group must keep the Python stack it was found by
(seen in CI: "the 2 other ranks are in 0x7fff42335b40 at ?:0", and no verdict named the right group).
A stand-in py-spy (a script answering ``dump --json``) is the one thing faked: no rank is needed."""

from __future__ import annotations

import json
import time

import pytest

from mpilaunch.hang import probe

PYTHON_FRAMES = [{"name": "main", "filename": "/work/hang.py", "line": 49}]


def fake_py_spy(tmp_path, native_frames) -> str:
    spy = tmp_path / "py-spy"
    native = json.dumps([{"os_thread_id": 11, "frames": native_frames}])
    plain = json.dumps([{"os_thread_id": 11, "frames": PYTHON_FRAMES}])
    spy.write_text(f"#!/bin/sh\ncase \"$*\" in\n  *--native*) echo '{native}' ;;\n  *) echo '{plain}' ;;\nesac\n")
    spy.chmod(0o755)
    return str(spy)


def ranks_found_by_python(spy: str) -> list[dict]:
    frames, tool, _ = probe.py_spy_frames(spy, 11, "S", 5.0, native=False)
    return [{"rank": r, "pid": 11, "state": "running", "frames": frames, "tool": tool} for r in (0, 1)]


@pytest.mark.parametrize(
    "unreadable",
    [
        {"name": "0x7fff42335b40", "filename": "", "line": 0, "module": "[vdso]"},
        # no module either (seen in CI at 0c04bc9: "the 2 other ranks are in 0x7fffa44b9bf0 at ?:0"):
        # it passed for a Python frame, so the dump was kept
        {"name": "0x7fffa44b9bf0", "filename": "", "line": 0},
    ],
    ids=["in-vdso", "no-module"],
)
def test_an_unreadable_native_dump_leaves_the_python_stack_in_place(tmp_path, unreadable):
    spy = fake_py_spy(tmp_path, [unreadable])
    ranks = ranks_found_by_python(spy)
    deadline = time.monotonic() + 10
    probe.add_native_frames(spy, ranks, lambda: deadline - time.monotonic())
    assert [[f["function"] for f in r["frames"]] for r in ranks] == [["main"], ["main"]]
    assert all(r["tool"] == "py-spy" for r in ranks)


def test_a_native_dump_with_the_python_frames_is_given_to_the_group(tmp_path):
    native = [
        {"name": "PMPI_Allreduce", "filename": "", "line": 0, "module": "libmpi.so.40"},
        *PYTHON_FRAMES,
    ]
    spy = fake_py_spy(tmp_path, native)
    ranks = ranks_found_by_python(spy)
    deadline = time.monotonic() + 10
    probe.add_native_frames(spy, ranks, lambda: deadline - time.monotonic())
    assert [[f["function"] for f in r["frames"]] for r in ranks] == [["PMPI_Allreduce", "main"]] * 2
    assert ranks[1]["native_from"] == 0
