"""A rank whose end mpilaunch did not see is ``exit_code: null`` in report.json, with the reason, never 0.

mpilaunch stops mpirun itself after a failed rank that mpirun does not act on
(fail fast), a failed MPI daemon, a misplaced rank and a lost worker. mpirun's
exit status then has one owner, its Popen (``procs.terminate_group`` waits
through it): a wait by pid used to reap mpirun behind the Popen's back, whose
own wait then read 0, so every rank that had not reported was recorded as
exit 0, and a lost worker's job gained a spurious "missing ranks" placement
failure.

The jobs are real (MPICH's hydra, which waits for the other ranks when one
fails without MPI_Abort, and for a proxy that never connects back). Their
other ranks run ``tests/programs/fail_rank.py`` with VANISH_ON_TERM: on
SIGTERM they SIGKILL their own wrapper, so no exit status line ever comes for
them, whatever the MPI's teardown does. The last test is ``--retries`` on the
local backend: a relaunch replaces only its own job's lost worker, not the
same-named worker of another job.
"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from mpilaunch.runtime.procs import terminate_group, wait_exit
from mpilaunch.workloads.mpirun import NEVER_STARTED, STOPPED, unobserved_reason
from support.helpers import (
    PROGRAMS,
    REPO,
    agent_pid,
    agent_workers,
    assert_local_worker_lost,
    leftover_processes,
    mpilaunch_env,
    run_mpilaunch,
    wait_for,
    wait_started,
)

FAIL_RANK = ["--", sys.executable, "tests/programs/fail_rank.py"]


def report_of(out_dir):
    return json.loads((out_dir / "report.json").read_text())


def ranks_of(report):
    return [(r["rank"], r["exit_code"], r["unobserved"]) for r in report["ranks"]]


# ------------------------------------------------------------------ the pure parts


def test_only_an_mpirun_that_ended_by_itself_with_0_vouches_for_unreported_ranks():
    assert unobserved_reason(0, None) is None
    # stopped by mpilaunch: whatever code its teardown left, 0 included
    assert unobserved_reason(0, f"{STOPPED} after rank 2 failed") == f"{STOPPED} after rank 2 failed"
    assert unobserved_reason(-15, f"{STOPPED} after rank 2 failed") == f"{STOPPED} after rank 2 failed"
    assert unobserved_reason(255, None) == "mpirun exited with code 255 before this rank's exit status came"
    assert unobserved_reason(None, None) == NEVER_STARTED


def test_terminate_group_leaves_the_exit_status_to_the_popen_its_caller_waits_on():
    """The child exits 3 on SIGTERM: both terminate_group and a wait on another thread read 3 (it read 0)."""
    import threading

    proc = subprocess.Popen(["sh", "-c", "trap 'exit 3' TERM; while :; do sleep 0.05; done"], start_new_session=True)
    time.sleep(0.3)  # the trap is set
    waited = {}

    def wait():
        while "code" not in waited:
            try:
                waited["code"] = wait_exit(proc, 0.5)
            except subprocess.TimeoutExpired:
                pass

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert terminate_group(proc, grace=10) == 3
    waiter.join(timeout=10)
    assert waited == {"code": 3} and proc.returncode == 3
    # one that ignores SIGTERM: SIGKILLed after the grace, and says so
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"], start_new_session=True)
    time.sleep(0.3)
    assert terminate_group(proc, grace=0.5) == -signal.SIGKILL


# ------------------------------------------------------------------ real jobs


@pytest.mark.mpi
@pytest.mark.parametrize("mpi_install", ["mpich"], indirect=True)
def test_fail_fast_stop_records_the_other_ranks_as_unobserved(mpi_install, tmp_path):
    """Rank 3 exits 7; hydra waits for the others, mpilaunch stops it after the fail-fast grace."""
    name = "unobs-failfast"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--timeout",
            "90",
            "-q",
            "--output-dir",
            str(tmp_path),
            *FAIL_RANK,
        ],
        mpi_install,
        env_extra={"FAIL_RANK": "3", "FAIL_CODE": "7", "VANISH_ON_TERM": "1"},
        timeout=150,
    )
    assert proc.returncode == 7, proc.stderr[-2000:]
    report = report_of(tmp_path)
    why = f"{STOPPED} after rank 3 failed"
    assert ranks_of(report) == [(0, None, why), (1, None, why), (2, None, why), (3, 7, None)], report["ranks"]
    assert leftover_processes(name) == []


@pytest.mark.mpi
@pytest.mark.parametrize("mpi_install", ["mpich"], indirect=True)
def test_daemon_failure_stop_records_every_rank_as_unobserved(mpi_install, tmp_path):
    """Every proxy is told to reach mpiexec at a name that does not resolve: no rank ever starts."""
    name = "unobs-daemon"
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
            "--output-dir",
            str(tmp_path),
            "--",
            "true",
        ],
        mpi_install,
        timeout=150,
    )
    assert proc.returncode not in (0, 124), proc.stderr[-2000:]
    report = report_of(tmp_path)
    assert [r["exit_code"] for r in report["ranks"]] == [None, None], report["ranks"]
    reasons = {r["unobserved"] for r in report["ranks"]}
    assert len(reasons) == 1 and reasons.pop().startswith(f"{STOPPED} after the MPI daemon on worker {name}-worker-")
    assert leftover_processes(name) == []


@pytest.mark.mpi
@pytest.mark.parametrize("mpi_install", ["mpich"], indirect=True)
def test_misplaced_rank_stop_records_the_ranks_as_unobserved(mpi_install, tmp_path):
    """A hostfile naming localhost: mpirun forks ranks 0-1 itself (as in test_verify)."""
    name = "unobs-misplaced"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost:2\nunobs-elsewhere:2\n")
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--backend",
            "local",
            "--hostfile",
            str(hostfile),
            "--timeout",
            "90",
            "-q",
            "--output-dir",
            str(out),
            *FAIL_RANK,
        ],
        mpi_install,
        env_extra={"FAIL_RANK": "-1", "VANISH_ON_TERM": "1"},
        timeout=150,
    )
    assert proc.returncode == 4, proc.stderr[-2000:]
    report = report_of(out)
    why = f"{STOPPED} after the placement check failed"
    assert ranks_of(report) == [(r, None, why) for r in range(4)], report["ranks"]
    assert leftover_processes(name) == []


def pending_signals(pid: int) -> int:
    """The process-wide pending signals of ``pid`` (a bit mask, signal n is bit n-1)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("ShdPnd:")).split()[1], 16)


@pytest.mark.mpi
@pytest.mark.parametrize("mpi_install", ["mpich"], indirect=True)
def test_lost_worker_stop_records_ranks_as_unobserved_and_no_placement_failure(mpi_install, tmp_path):
    """Worker 1's agent is SIGKILLed while mpiexec is held (SIGSTOP), as a hydra that never notices
    a dead proxy: the lost-worker watch stops mpirun. mpiexec, let go once that SIGTERM is pending,
    ends within the grace. Its status used to be reaped behind the Popen (read as 0), and mpirun
    "ending well" with no rank reported made the placement check add "missing ranks"."""
    name = "unobs-lost"

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
            "--output-dir",
            str(tmp_path),
            *FAIL_RANK,
        ],
        cwd=REPO,
        env=mpilaunch_env(mpi_install, FAIL_RANK="-1", VANISH_ON_TERM="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = None
    try:
        wait_started(proc, 4, timeout=120)
        held = next(p for p in psutil.Process(proc.pid).children() if "mpiexec" in " ".join(p.cmdline()))
        held.suspend()
        victim = agent_pid(f"{name}-worker-1")
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pending_signals(held.pid) & (1 << (signal.SIGTERM - 1)), 30, "mpilaunch's SIGTERM to mpiexec")
        held.resume()
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            if held is not None:
                held.resume()
            proc.kill()
            proc.communicate()
    assert_local_worker_lost(proc, err, name, 1, victim)
    report = report_of(tmp_path)
    assert "placement check failed" not in err and "placement check failed" not in report["failure"], err[-2000:]
    assert report["placement"]["mismatch"] is None
    why = f"{STOPPED} after worker {name}-worker-1 was lost"
    assert ranks_of(report) == [(r, None, why) for r in range(4)], report["ranks"]
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ --retries beside a job of the same name


def agent_of(job_pid: int, worker: str) -> int:
    """The agent of ``worker`` that the mpilaunch ``job_pid`` started: forked from it (its child),
    or started as an interpreter of its own (``--exit-with-pid``)."""
    for pid, served in agent_workers().items():
        try:
            agent = psutil.Process(pid)
            cmd = agent.cmdline()
            if served == worker and (
                agent.ppid() == job_pid
                or ("--exit-with-pid" in cmd and cmd[cmd.index("--exit-with-pid") + 1] == str(job_pid))
            ):
                return pid
        except (psutil.Error, IndexError):
            continue
    raise AssertionError(f"no agent of {worker} for mpilaunch {job_pid}")


# the bystander's ranks: up, then done after a while (ATTEMPT_MARKER as tests/programs/attempts.py's)
BYSTANDER = (
    "import os, time; print('unit started (first attempt)', flush=True); time.sleep(25); "
    "print('unit done on', os.environ['MPILAUNCH_WORKER'], flush=True)"
)


@pytest.mark.mpi
def test_local_retry_replaces_only_its_own_worker_beside_a_job_of_the_same_name(openmpi5, tmp_path):
    """Two local jobs named alike run at once; one loses worker 1 and relaunches (--retries 1).
    The replacement sweep matched workers by name alone and SIGKILLed the other job's rank 1 and its
    daemon (Open MPI 5's prterun then ended that job, with exit 0: hence the ranks' own "done" lines)."""
    job = "retries-twin"
    env = mpilaunch_env(PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"])

    def launch(where, *command):
        where.mkdir()
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpilaunch",
                "--name",
                job,
                "--np",
                "2",
                "--slots-per-worker",
                "1",
                "-q",
                "--output-dir",
                str(where / "out"),
                "-x",
                f"ATTEMPT_MARKER={where / 'marker'}",
                *command,
            ],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    bystander = launch(tmp_path / "bystander", "--", sys.executable, "-c", BYSTANDER)
    retrying = launch(tmp_path / "retrying", "--retries", "1", "--", sys.executable, str(PROGRAMS / "attempts.py"))
    procs = (bystander, retrying)
    try:
        seen = wait_started(bystander, 2, "started (first attempt)")
        wait_started(retrying, 2, "started (first attempt)")
        os.kill(agent_of(retrying.pid, f"{job}-worker-1"), signal.SIGKILL)
        _, retry_err = retrying.communicate(timeout=180)
        assert retrying.returncode == 0, retry_err[-6000:]
        assert "attempt 2 of 2: relaunching replacing" in retry_err
        assert bystander.poll() is None  # the relaunch came and went while the bystander's ranks ran
        by_out, by_err = bystander.communicate(timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert bystander.returncode == 0, by_err[-3000:]
    done = sorted(line.split()[-1] for line in ("".join(seen) + by_out).splitlines() if "unit done on" in line)
    assert done == [f"{job}-worker-0", f"{job}-worker-1"], by_out + by_err[-3000:]
    report = report_of(tmp_path / "bystander" / "out")
    assert report["exit_code"] == 0 and [r["exit_code"] for r in report["ranks"]] == [0, 0], report["ranks"]
    assert report["lost_workers"] == []
    assert leftover_processes(job) == []


class _ReapedLate:
    """A worker's agent whose exit its parent does not see yet: ``poll()`` says "running" once.
    The kernel's moment between a SIGKILLed agent's sockets closing and the agent being
    reapable cannot be made on demand; this stands in for it (the agent itself is real)."""

    def __init__(self, agent):
        self.agent, self.hidden = agent, True

    def poll(self):
        if self.hidden:
            self.hidden = False
            return None
        return self.agent.poll()

    def __getattr__(self, name):
        return getattr(self.agent, name)


def test_local_agent_killed_but_not_yet_reaped_is_still_a_lost_worker(tmp_path):
    """A failed run's diagnosis asks whether a worker was lost the moment mpirun ended; a killed
    agent not yet reaped then (CI: the job failed as an MPI error and --retries did not relaunch
    it) is found by the ping it no longer answers, and the wait for its exit that follows."""
    from mpilaunch.backends.local.backend import LocalBackend
    from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan

    spec = JobSpec(command=("true",), name="settle", np=2)
    backend = LocalBackend(
        spec, Plan("settle", (WorkerPlan("settle-worker-0", 1, 0), WorkerPlan("settle-worker-1", 1, 0))), tmp_path
    )
    try:
        backend.allocate()
        victim = backend.agents["settle-worker-1"]
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(
            lambda: open(f"/proc/{victim.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
            10,
            "the killed agent to become a zombie",
        )
        backend.agents["settle-worker-1"] = _ReapedLate(victim)
        assert backend.lost_workers(settle=True) == {"settle-worker-1": "its agent was killed by SIGKILL"}
    finally:
        backend.release()
    assert leftover_processes("settle") == []


def test_mpirun_exit_0_with_unreported_ranks_on_a_lost_worker_is_a_lost_worker():
    """Open MPI 5's prterun can end with 0 after losing a daemon and its ranks: an exit 0
    vouches for the job only when every rank's own exit status came; otherwise the backend
    is asked, and a lost worker makes it exit 5."""
    from mpilaunch.core.result import JobResult
    from mpilaunch.job import lifecycle

    class Backend:
        def __init__(self, lost):
            self.lost = lost

        def lost_workers(self, settle=False):
            return dict(self.lost)

        def describe_workers(self):
            return {"w-1": {"host": "localhost", "pid": 42}}

    class Workload:
        def __init__(self, reported):
            self.reported = reported

        def all_units_reported(self):
            return self.reported

        def units_on(self, worker):
            return "rank 1"

    lost = {"w-1": "its agent was killed by SIGKILL"}
    for reported, backend_lost, code in ((True, lost, 0), (False, {}, 0), (False, lost, EXIT_WORKER_LOST)):
        result = JobResult(job_name="j", exit_code=0)
        found = lifecycle.diagnose_lost_workers(Backend(backend_lost), Workload(reported), result, {})
        assert result.exit_code == code and [w.worker for w in found] == (["w-1"] if code else [])
