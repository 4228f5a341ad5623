"""Teardown on every exit path of ``lifecycle.run_job``: release exactly once, in order, nothing left.

Success, a failed rank, a misplaced rank, a lost worker, a timeout, an
allocation error, a failed credential, Ctrl-C/SIGTERM, a crash in start or
watch, a failed retry: each path stops the workload, tells the backend the
outcome, releases it once, writes report.json and removes the run directory.
"""

from __future__ import annotations

import signal
import threading

import pytest

from mpilaunch.core.errors import AllocationError
from mpilaunch.core.exit_codes import EXIT_ALLOCATION, EXIT_INTERRUPTED, EXIT_PLACEMENT, EXIT_TIMEOUT, EXIT_WORKER_LOST
from support.fake_backend import Script
from support.fake_workload import loses, misplaced, raises, rank_fails, runs_until_stopped, sends, succeeds, times_out

LOST = "job-worker-1"
TEARDOWN = ["stop", "job_finished", "describe_workers", "release", "close", "collect", "report"]

# id: (outcomes, backend script, workload script, spec options, exit code or None for a crash, what run_job raises)
PATHS = {
    "success": ([succeeds()], None, None, {}, 0, None),
    "rank-failure": ([rank_fails(2)], None, None, {}, 1, None),
    "misplaced-rank": ([misplaced(3)], None, None, {}, EXIT_PLACEMENT, None),
    "lost-worker": ([loses(LOST, "Evicted")], None, None, {}, EXIT_WORKER_LOST, None),
    "timeout": ([times_out()], None, None, {"timeout": 0.05}, EXIT_TIMEOUT, None),
    "allocation-error-in-allocate": (
        [],
        Script(allocate=AllocationError("quota exceeded")),
        None,
        {},
        EXIT_ALLOCATION,
        AllocationError,
    ),
    "allocation-error-in-wait-ready": (
        [],
        Script(wait_ready=AllocationError("0/2 nodes available")),
        None,
        {},
        EXIT_ALLOCATION,
        AllocationError,
    ),
    "credentials-fail-during-watch": (
        [runs_until_stopped()],
        Script(lost_workers=AllocationError("401")),
        None,
        {},
        EXIT_ALLOCATION,
        AllocationError,
    ),
    "sigint-in-wait-ready": ([], Script(wait_ready=signal.SIGINT), None, {}, EXIT_INTERRUPTED, None),
    "sigterm-in-watch": ([sends(signal.SIGTERM)], None, None, {}, EXIT_INTERRUPTED, None),
    "exception-in-watch": ([raises(RuntimeError("bug in watch"))], None, None, {}, None, RuntimeError),
    "exception-in-start": ([], None, Script(start=RuntimeError("bug in start")), {}, None, RuntimeError),
    "exception-in-exec-context": ([], Script(exec_context=OSError("disk full")), None, {}, None, OSError),
    "retries-exhausted": (
        [loses(LOST, "Evicted"), loses(LOST, "Evicted again")],
        None,
        None,
        {"retries": 1},
        EXIT_WORKER_LOST,
        None,
    ),
    "sigint-in-replacement-wait": (
        [loses(LOST, "Evicted")],
        Script(wait_ready={2: signal.SIGINT}),
        None,
        {"retries": 1},
        EXIT_INTERRUPTED,
        None,
    ),
    "allocation-error-in-retry": (
        [loses(LOST, "Evicted")],
        Script(replace_workers=AllocationError("no node")),
        None,
        {"retries": 1},
        EXIT_ALLOCATION,
        AllocationError,
    ),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_releases_exactly_once_and_tears_down_in_order(run_fake, path):
    outcomes, backend, workload, options, code, raised = PATHS[path]
    job = run_fake(*outcomes, backend=backend, workload=workload, raises=raised, **options)

    assert job.log.count("release") == 1
    names = job.log.names(skip=("note_stop",))
    assert names[names.index("job_finished") - 1 :] == TEARDOWN  # the workload stopped before the release
    assert not job.rundir.exists()
    report = job.report()  # written on every path, crashes included
    if code is not None:
        assert job.exit_code == code
        assert report["exit_code"] == code


def test_success_runs_each_step_once_in_the_documented_order(run_fake):
    job = run_fake(succeeds())

    assert job.log.names() == ["allocate", "wait_ready", "exec_context", "start", "watch", *TEARDOWN]
    assert job.result.exit_code == 0 and job.result.failure is None
    assert [r.exit_code for r in job.result.ranks] == [0, 0, 0, 0]


def test_job_finished_hears_the_final_outcome_and_its_text_joins_the_failure(run_fake):
    job = run_fake(rank_fails(2), backend=Script(job_finished=lambda: "final status: FAILED (diagnostics)"))

    [(code, failure)] = job.log.args("job_finished")
    assert code == 1 and failure.startswith("rank 2 on worker job-worker-1 exited with code 1")
    assert job.result.failure == f"{failure}\nfinal status: FAILED (diagnostics)"
    assert job.report()["failure"] == job.result.failure


def test_job_finished_text_is_no_failure_of_a_successful_job(run_fake):
    job = run_fake(succeeds(), backend=Script(job_finished=lambda: "final status: SUCCEEDED"))

    assert job.log.args("job_finished") == [(0, None)]
    assert job.result.exit_code == 0 and job.result.failure is None


def test_a_crash_reaches_the_caller_unchanged(run_fake):
    bug = RuntimeError("bug in watch")
    job = run_fake(raises(bug), raises=RuntimeError)

    assert job.error is bug


def test_an_allocation_error_keeps_its_message_and_starts_nothing(run_fake):
    job = run_fake(
        backend=Script(wait_ready=AllocationError("0/2 nodes are available: Insufficient cpu")), raises=AllocationError
    )

    assert job.error.message == "0/2 nodes are available: Insufficient cpu"
    assert "start" not in job.log.names() and "exec_context" not in job.log.names()
    assert job.report()["failure"] == "0/2 nodes are available: Insufficient cpu"


def test_the_lost_worker_watch_ends_with_the_run(run_fake):
    job = run_fake(raises(RuntimeError("bug in watch")), raises=RuntimeError)

    assert not [t for t in threading.enumerate() if t.name == "lost-worker-watch"]
    polls = job.backend.polls
    threading.Event().wait(0.1)  # five watch intervals
    assert job.backend.polls == polls  # nobody asks a released backend


# release() must never raise (backends/base.py), and the real backends catch what their cleanup raises;
# a backend that breaks that rule should still not cost the user the rest of the teardown.
def test_a_release_that_raises_still_leaves_report_and_no_rundir(run_fake):
    job = run_fake(succeeds(), backend=Script(release=RuntimeError("API server gone")))

    assert (job.output_dir / "report.json").exists()
    assert not job.rundir.exists()
    assert job.result.exit_code == 0  # the job's own outcome stands
    assert "releasing the job's workers failed: API server gone" in job.stderr.getvalue()


def test_a_job_finished_that_raises_still_releases(run_fake):
    job = run_fake(rank_fails(2), backend=Script(job_finished=OSError("ResourceManager unreachable")))

    assert job.log.count("release") == 1
    assert job.result.exit_code == 1
    assert "could not report the job's end: ResourceManager unreachable" in job.stderr.getvalue()


def test_a_backend_verdict_at_the_end_becomes_the_outcome_of_a_job_that_had_none(run_fake):
    # a Kubernetes backend whose refreshed token is refused while it records the end (CredentialError)
    job = run_fake(succeeds(), backend=Script(job_finished=AllocationError("cluster credentials failed: refused")))

    assert job.log.count("release") == 1
    assert job.result.exit_code == EXIT_ALLOCATION
    assert job.result.failure == "cluster credentials failed: refused"
    assert "warning" not in job.stderr.getvalue()


def test_a_backend_verdict_at_the_end_leaves_an_earlier_failure_standing(run_fake):
    job = run_fake(rank_fails(2, code=7), backend=Script(job_finished=AllocationError("cluster credentials failed")))

    assert job.log.count("release") == 1
    assert job.result.exit_code == 7 and "rank 2" in job.result.failure
