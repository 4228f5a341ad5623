"""--straggler-report on the local backend: 8 real ranks (Open MPI 4, Debian's, with its mpi4py) in an
allreduce loop, one of them slow in its data loading (tests/programs/straggler.py); every rank's
stacks sampled through the agents while the job runs, as the hang diagnosis takes them."""

from __future__ import annotations

import json
import sys

import pytest

from support.helpers import PROGRAMS, leftover_processes, run_mpilaunch
from support.mpi_installs import checked, installs

pytestmark = pytest.mark.mpi

STRAGGLER = PROGRAMS / "straggler.py"
LOAD_LINE = next(i for i, line in enumerate(STRAGGLER.read_text().splitlines(), 1) if "the straggler's" in line)


@pytest.fixture
def openmpi4():
    return checked(installs()["openmpi4"])


def run_loop(openmpi4, tmp_path, name: str, slow: int, steps: int = 14, step_s: float = 0.8):
    return run_mpilaunch(
        ["--name", name, "--np", "8", "--slots-per-worker", "2", "--straggler-report", "0.5",
         "--output-dir", str(tmp_path), "--", sys.executable, str(STRAGGLER), str(steps), str(slow), str(step_s)],
        openmpi4,
        timeout=180,
    )  # fmt: skip


def straggler_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: straggler:")]


def test_straggler_the_slow_rank_among_8_is_named_with_where_it_was(openmpi4, tmp_path):
    proc = run_loop(openmpi4, tmp_path, "st-slow", slow=5, steps=10)  # 10 steps of 1.8 s
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = straggler_lines(proc.stderr)
    assert line.startswith("mpilaunch: straggler: rank 5 (st-slow-worker-2) spent "), line
    assert f"of samples in time.sleep at straggler.py:{LOAD_LINE} while 7 others waited in MPI_Allreduce" in line, line
    found = json.loads((tmp_path / "report.json").read_text())["stragglers"]
    assert found["straggler"] == 5 and found["line"] == line
    assert found["samples"] >= 6 and found["shares"]["5"] == max(found["shares"].values())
    assert leftover_processes("st-slow") == []


def test_straggler_no_false_report_on_a_healthy_job(openmpi4, tmp_path):
    proc = run_loop(openmpi4, tmp_path, "st-ok", slow=-1, steps=40)  # 8 s of 0.2 s steps: ~14 samples
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert straggler_lines(proc.stderr) == []
    found = json.loads((tmp_path / "report.json").read_text())["stragglers"]
    assert found["straggler"] is None and found["samples"] >= 8, found
