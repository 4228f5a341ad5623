"""A failed hydra proxy (MPICH, Intel MPI) ends the job within seconds, with its own error.

hydra ignores its launcher's exit: a proxy that never connects back, or whose
worker is lost, used to leave mpiexec (and mpilaunch) waiting until --timeout,
or forever without one (the MPICH real-pods flake). Each test has a --timeout
of 90 s, so a regression shows as exit 124 after 90 s, not as a hung suite.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from support.helpers import REPO, agent_pid, leftover_processes, mpilaunch_env, run_mpilaunch, wait_started

pytestmark = pytest.mark.mpi

BOUND_S = 40  # fail-fast grace (5 s) + teardown on a loaded 2-core machine


def summary(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("mpilaunch: error: "))


@pytest.mark.parametrize("mpi_install", ["mpich"], indirect=True)
def test_hydra_proxies_that_cannot_connect_back_end_the_job_with_their_error(mpi_install):
    """Every proxy is told to reach mpiexec at a name that does not resolve
    (as when the launcher's name does not resolve from the workers)."""
    name = "hydra-noconnect"
    t0 = time.monotonic()
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--timeout",
            "90",
            "-q",
            "--mpi-args",
            "-localhost nowhere.invalid",
            "--",
            "true",
        ],
        mpi_install,
        timeout=150,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode not in (0, 124), proc.stderr[-2000:]
    line = summary(proc.stderr)
    assert "before any rank failed" in line and "unable to get host address for nowhere.invalid" in line, line
    assert elapsed < BOUND_S, f"took {elapsed:.0f}s"
    assert leftover_processes(name) == []


@pytest.mark.parametrize("mpi_install", ["mpich", "intel"], indirect=True)
def test_hydra_job_whose_worker_is_lost_mid_run_ends_naming_the_worker(mpi_install):
    """Ranks sleep on 2 workers; worker 1's agent is SIGKILLed (its proxy's exec
    session dies). The job ends within seconds as a lost worker (exit 5)."""
    name = f"hydra-lost-{mpi_install.id}"
    env = mpilaunch_env(mpi_install, SLEEP="120")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "--mpirun",
            mpi_install.mpirun,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--timeout",
            "90",
            "-q",
            "--",
            sys.executable,
            "tests/programs/unit.py",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_started(proc, 4, timeout=120)
        t0 = time.monotonic()
        victim = agent_pid(f"{name}-worker-1")
        os.kill(victim, signal.SIGKILL)
        _out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    elapsed = time.monotonic() - t0
    assert proc.returncode == 5, err[-2000:]
    assert summary(err).startswith(
        f"mpilaunch: error: worker {name}-worker-1 (agent pid {victim} on localhost) "
        "was lost: its agent was killed by SIGKILL"
    ), err[-2000:]
    assert elapsed < BOUND_S, f"took {elapsed:.0f}s"
    assert leftover_processes(name) == []
