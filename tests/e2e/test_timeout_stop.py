"""--timeout stops the job promptly, on every backend (issue 42 item 2).

Four ranks sleep far past ``--timeout 5``. mpilaunch must exit 124 at most
STOP_S after the timeout, its report.json saying every rank was stopped at
the timeout, with nothing of the job left. The ranks get SIGTERM at the
deadline; they used to get it 20 s late, after mpilaunch had waited 10 s for
each of mpirun's two output pipes, which cannot end while mpirun runs.

Locally the bound is counted from mpilaunch's start to its exit (its own
startup included); on YARN and on real pods from the moment the workers
were ready, when the timeout starts counting, to their release (report.json's
phases), because the allocation before it is the scheduler's and is not
bounded by --timeout.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from mpilaunch.workloads.hang_watch import TIMEOUT_DIAGNOSIS_S
from support.helpers import leftover_processes, run_mpilaunch, wait_for
from support.yarn import assert_released, start

TIMEOUT_S = 5
STOP_S = 5  # the bound: the timeout, plus the bounded diagnosis before the stop, plus 5 s
RANKS = 4
# the job's name on each rank's command line: leftover_processes finds a rank that survived
SLEEPER = "import time; time.sleep(600)"
KILLED_BY_STOP = {128 + signal.SIGTERM, 128 + signal.SIGKILL}  # the rank wrapper's codes for them


def sleeping_job(name: str, out, python: str = sys.executable) -> list[str]:
    """The job's options and command, but its --name (the real-pod fixture adds it itself)."""
    return [
        "--np",
        str(RANKS),
        "-q",
        "--timeout",
        str(TIMEOUT_S),
        "--output-dir",
        str(out),
        "--",
        python,
        "-c",
        SLEEPER,
        name,
    ]


def allowed_s(out) -> float:
    """The issue's bound on the stop: the timeout, plus the diagnosis taken before it (report.json's
    hang.collection_s, itself bounded), plus STOP_S."""
    hang = json.loads((out / "report.json").read_text()).get("hang") or {}
    diagnosis_s = hang.get("collection_s", 0.0)
    assert diagnosis_s <= TIMEOUT_DIAGNOSIS_S, hang
    return TIMEOUT_S + diagnosis_s + STOP_S


def stop_after_ready(out) -> float:
    """Seconds from the workers being ready (the timeout starts counting) to the release of the
    job's workers, the last thing before the exit (report.json's phases)."""
    phases = json.loads((out / "report.json").read_text())["timings"]["phases"]
    return phases["released"] - phases["workers_ready"]


def assert_stopped_at_timeout(code: int, err: str, out, within_s: float) -> dict:
    """Exit 124, the timeout's line, and a report.json whose run_s fits the stop."""
    assert code == EXIT_TIMEOUT, err
    assert f"mpilaunch: error: the job ran past --timeout {TIMEOUT_S}s and was stopped" in err, err
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == EXIT_TIMEOUT
    run_s = report["timings"]["run_s"]
    assert TIMEOUT_S <= run_s <= within_s, report["timings"]
    # each rank is either seen dying of the stop's signal (its wrapper's status line came through
    # before mpirun ended) or said to have been cut off by it; never a code of its own
    stopped = {f"mpirun was stopped by mpilaunch at --timeout {TIMEOUT_S}s"}
    assert [
        (r["rank"], r["exit_code"] in KILLED_BY_STOP or r.get("unobserved") in stopped) for r in report["ranks"]
    ] == [(rank, True) for rank in range(RANKS)], report["ranks"]
    return report


@pytest.mark.mpi
def test_timeout_stops_sleeping_ranks_promptly_on_local(mpi_install, tmp_path):
    name = f"timeout-stop-{mpi_install.id}"
    t0 = time.monotonic()
    p = run_mpilaunch(["--name", name, *sleeping_job(name, tmp_path)], mpi_install, timeout=120)
    wall = time.monotonic() - t0
    assert p.returncode == EXIT_TIMEOUT, p.stderr
    assert wall <= allowed_s(tmp_path), f"exited {wall:.1f}s after its start (--timeout {TIMEOUT_S}): {p.stderr}"
    report = assert_stopped_at_timeout(p.returncode, p.stderr, tmp_path, wall)
    assert leftover_processes(name) == []
    print(f"{mpi_install.id}: exit 124 after {wall:.2f}s (run_s {report['timings']['run_s']})")


@pytest.mark.yarn
def finish_timed_out(proc, tmp_path, t0: float) -> tuple[str, float, dict, float]:
    """Wait for a job that --timeout stops: (stderr, seconds from ready to release, report, whole run),
    after checking exit 124 and the stop bound."""
    try:
        _, err = proc.communicate(timeout=300)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    wall = time.monotonic() - t0
    assert proc.returncode == EXIT_TIMEOUT, err
    stopped_after = stop_after_ready(tmp_path)
    assert stopped_after <= allowed_s(tmp_path), (
        f"released {stopped_after:.1f}s after the workers were ready (--timeout {TIMEOUT_S}): {err}"
    )
    return err, stopped_after, assert_stopped_at_timeout(proc.returncode, err, tmp_path, stopped_after), wall


@pytest.mark.parametrize("launcher", ["cluster", "local"])
def test_timeout_stops_sleeping_ranks_promptly_on_yarn(yarn, openmpi_env, launcher, tmp_path):
    name = f"yarn-timeout-stop-{launcher}"
    t0 = time.monotonic()
    proc = start(
        ["--name", name, "--launcher", launcher, "--memory", "256 MiB", *sleeping_job(name, tmp_path)], openmpi_env
    )
    # (what follows the release is timed by the local test's wall clock)
    err, stopped_after, report, wall = finish_timed_out(proc, tmp_path, t0)
    assert_released(yarn, name, "FAILED")
    assert wait_for(lambda: leftover_processes(name) == [], 10, "the ranks to be gone")
    print(
        f"yarn --launcher {launcher}: exit 124 {stopped_after:.2f}s after the workers were ready "
        f"(run_s {report['timings']['run_s']}, whole run {wall:.1f}s)"
    )


@pytest.mark.real_pods
def test_timeout_stops_sleeping_ranks_promptly_on_real_pods(real, tmp_path):
    job = "rp-timeout-stop"
    t0 = time.monotonic()
    proc = real.start(job, "--slots-per-worker", "2", *sleeping_job(job, tmp_path, python="python3"))
    err, stopped_after, report, wall = finish_timed_out(proc, tmp_path, t0)
    assert real.leftovers(job) == []
    assert wait_for(lambda: not real.containers_left(job), 60, "the kubelet to remove the job's containers")
    assert wait_for(lambda: leftover_processes(job) == [], 30, "the job's processes to end")
    print(
        f"real pods: exit 124 {stopped_after:.2f}s after the workers were ready "
        f"(run_s {report['timings']['run_s']}, whole run {wall:.1f}s)"
    )
