"""The same failure is reported the same way in mpirun mode and PS mode: one lifecycle judges both.

Two units (2 MPI ranks on 2 workers, or 2 PS worker tasks), each on its own
worker ``<job>-worker-<i>``: unit 1 exits non-zero, or worker 1 disappears
(its agent is SIGKILLed). Exit code, the failure's first line and the
report's common fields must not depend on the mode.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from support.helpers import REPO, agent_pid, leftover_processes, mpilaunch_env, wait_started

pytestmark = pytest.mark.mpi

PROGRAM = str(REPO / "tests/programs/unit.py")
MODES = {
    "mpirun": ["--np", "2", "--slots-per-worker", "1"],
    "ps": ["--mode", "ps", "--workers", "2"],
}
LOST_UNITS = {"mpirun": "rank 1", "ps": "task worker:1"}
COMMON_FIELDS = {
    "job",
    "mode",
    "backend",
    "command",
    "plan",
    "workers",
    "exit_code",
    "failure",
    "timings",
    "lost_workers",
}


@pytest.fixture
def start():
    """Start mpilaunch; a test that fails half-way must not leave its job running for the next one."""
    started = []

    def start(name, mode, out, **env):
        cmd = [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            *MODES[mode],
            "-q",
            "--output-dir",
            str(out),
            "--",
            sys.executable,
            PROGRAM,
        ]
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=mpilaunch_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # mpilaunch's own teardown
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def first_error_line(err):
    return next(line for line in err.splitlines() if line.startswith("mpilaunch: error: "))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_unit_exit_code_is_the_job_exit_code_in_both_modes(start, openmpi5, mode, tmp_path):
    name = f"parity-exit-{mode}"
    proc = start(
        name,
        mode,
        tmp_path,
        PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"],
        FAIL_UNIT="1",
        FAIL_CODE="7",
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 7, out + err
    line = first_error_line(err)
    assert line.endswith(f"on {'worker ' if mode == 'mpirun' else ''}{name}-worker-1 exited with code 7"), err
    report = json.loads((tmp_path / "report.json").read_text())
    assert COMMON_FIELDS <= set(report) and report["mode"] == mode
    assert report["exit_code"] == 7 and report["lost_workers"] == []
    assert leftover_processes(name) == []


@pytest.mark.parametrize("mode", sorted(MODES))
def test_lost_worker_is_reported_the_same_way_in_both_modes(start, openmpi5, mode, tmp_path):
    name = f"parity-lost-{mode}"
    private_dirs = os.path.join(tempfile.gettempdir(), f"mpilaunch-{name}-*")
    earlier = set(glob.glob(private_dirs))
    proc = start(
        name, mode, tmp_path, PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"], SLEEP="120"
    )
    wait_started(proc, 2, timeout=120)
    victim = agent_pid(f"{name}-worker-1")
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_WORKER_LOST == 5, out + err
    # named first: which worker, where it lived, why, and what ran there
    lost = (
        f"worker {name}-worker-1 (agent pid {victim} on localhost) was lost: its agent was killed by SIGKILL; "
        f"{LOST_UNITS[mode]} ran there"
    )
    assert first_error_line(err) == f"mpilaunch: error: {lost}", err
    report = json.loads((tmp_path / "report.json").read_text())
    assert COMMON_FIELDS <= set(report) and report["mode"] == mode
    assert report["exit_code"] == 5 and report["lost_workers"] == [f"{name}-worker-1"]
    assert report["lost"] == [
        {
            "worker": f"{name}-worker-1",
            "reason": "its agent was killed by SIGKILL",
            "where": f"agent pid {victim} on localhost",
            "units": LOST_UNITS[mode],
        }
    ]
    assert report["failure"].splitlines()[0] == lost
    assert leftover_processes(name) == []
    # the killed agent's private TMPDIR named it as owner: mpilaunch's end removed it
    assert set(glob.glob(private_dirs)) - earlier == set()
