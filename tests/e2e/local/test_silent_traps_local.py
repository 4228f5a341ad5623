"""Issue 51's silent traps that are about a run, with real MPI on the local backend.

c. A program that does not exist is found on this machine before any worker starts: one line,
   a hint, exit 2 (it was found by every rank after the allocation: one line per rank, exit 127).
   --output-ranks (item 6): only the chosen ranks' lines on the terminal, every rank in its log.
"""

from __future__ import annotations

import sys
import time

import pytest

from support.helpers import leftover_processes, run_mpilaunch

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "command, said",
    [
        (["no-such-program-51", "--epochs", "3"], "mpilaunch: error: the program 'no-such-program-51' is not on PATH"),
        ([sys.executable, "trian.py"], "mpilaunch: error: the Python script trian.py does not exist in "),
    ],
    ids=["program", "python-script"],
)
def test_silent_trap_c_missing_program_refused_before_allocating(openmpi5, command, said):
    name = "st-missing-" + ("script" if "trian.py" in command else "program")
    t0 = time.monotonic()
    proc = run_mpilaunch(["--name", name, "--np", "8", "--slots-per-worker", "2", "--", *command], openmpi5)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(said) and lines[1].startswith("  hint: "), proc.stderr
    assert proc.stdout == ""
    assert "waiting for" not in proc.stderr  # no worker was started
    assert elapsed < 10, elapsed
    assert leftover_processes(name) == []


RANK_PROGRAM = (
    "import os, sys, time; r = int(os.environ['OMPI_COMM_WORLD_RANK']); "
    "print('hello from', r, flush=True); print('note from', r, file=sys.stderr, flush=True); "
    "time.sleep(1); sys.exit(3 if r == 1 else 0)"
)


def test_output_ranks_shows_the_chosen_ranks_and_logs_every_rank(openmpi5, tmp_path):
    name = "st-output-ranks"
    out = tmp_path / "out"
    proc = run_mpilaunch(
        ["--name", name, "--np", "4", "--slots-per-worker", "2", "--output-ranks", "0,3", "--output-dir", str(out)]
        + ["-q", "--", sys.executable, "-c", RANK_PROGRAM],
        openmpi5,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    shown = sorted(line for line in proc.stdout.splitlines() if "hello from" in line)
    assert shown == ["[0] hello from 0", "[3] hello from 3"], proc.stdout
    assert "[1] note from 1" not in proc.stderr and "[2] note from 2" not in proc.stderr, proc.stderr
    assert "[0] note from 0" in proc.stderr, proc.stderr
    # mpilaunch's own lines always show: the failing rank 1 is named though its lines are filtered
    assert "mpilaunch: error: rank 1 on worker st-output-ranks-worker-0 exited with code 3" in proc.stderr
    for rank in range(4):
        log = (out / f"rank-{rank}.log").read_text()
        assert f"hello from {rank}\n" in log and f"note from {rank}\n" in log, (rank, log)
    assert leftover_processes(name) == []
