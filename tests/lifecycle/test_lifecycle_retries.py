"""--retries N and --retry-rank-failures in ``lifecycle.run_job``: when a job is relaunched, in which order, how often.

A relaunch stops the attempt, then ``workload.reset`` -> ``backend.replace_workers``
(lost workers only) -> ``backend.relaunch`` -> ``wait_ready`` + a new context
file (when something new must come up) -> ``workload.start``. A timeout or a
misplaced rank is never retried, a failed rank only with --retry-rank-failures.
"""

from __future__ import annotations

import pytest

from mpilaunch.core.errors import AllocationError
from mpilaunch.core.exit_codes import EXIT_ALLOCATION, EXIT_PLACEMENT, EXIT_TIMEOUT, EXIT_WORKER_LOST
from support.fake_backend import Script
from support.fake_workload import loses, misplaced, rank_fails, succeeds, times_out

LOST = "job-worker-1"
NOISE = ("stop", "note_stop")  # the watch's and retry's stop() calls: checked apart


def test_a_lost_worker_is_replaced_then_the_workload_starts_again_in_order(run_fake):
    job = run_fake(loses(LOST, "Evicted"), succeeds(), retries=1)

    assert job.log.between(("watch", 1), ("start", 2), skip=NOISE) == [
        "describe_workers",  # where the lost worker lived, for the message
        "reset",
        "replace_workers",
        "relaunch",
        "wait_ready",
        "exec_context",
        "start",
    ]
    names = job.log.names()
    assert names.index("reset") - 1 == names.index("stop", names.index("describe_workers"))  # stopped first
    assert job.log.args("reset") == [(2,)] and job.log.args("relaunch") == [(2,)]
    assert job.log.args("replace_workers") == [([LOST],)]
    assert job.log.args("start") == [(1,), (2,)]


def test_a_retry_that_succeeds_on_attempt_2_exits_0_and_says_so(run_fake):
    job = run_fake(loses(LOST, "Evicted"), succeeds(), retries=2)

    assert job.result.exit_code == 0 and job.result.failure is None
    assert job.log.count("watch") == 2 and job.log.count("release") == 1
    assert (
        "mpilaunch: attempt 2 of 3: relaunching replacing job-worker-1 (attempt 1: worker job-worker-1 "
        "(pod job-worker-1 on node node-1) was lost: Evicted; ranks 2-3 ran there)"
    ) in job.stderr.getvalue()


def test_the_replacement_worker_is_in_the_new_context_file(run_fake):
    job = run_fake(loses(LOST, "Evicted"), succeeds(), retries=1)

    first, second = (context["workers"][LOST]["address"] for context in job.workload.contexts)
    assert first != second
    assert second == job.backend.address(LOST)  # the shim of attempt 2 reaches the new worker
    assert job.workload.contexts[0]["job"] == "job"


@pytest.mark.parametrize("retries", [1, 2])
def test_retries_stop_after_n_relaunches(run_fake, retries):
    outcomes = [loses(LOST, f"Evicted {n}") for n in range(retries + 1)]
    job = run_fake(*outcomes, retries=retries)

    assert job.log.count("watch") == retries + 1
    assert job.log.args("reset") == [(n,) for n in range(2, retries + 2)]
    assert job.result.exit_code == EXIT_WORKER_LOST
    assert job.result.failure.startswith(
        f"worker job-worker-1 (pod job-worker-1 on node node-1) was lost: Evicted {retries};"
    )


def test_without_retries_a_lost_worker_is_not_replaced(run_fake):
    job = run_fake(loses(LOST, "Evicted"))

    assert job.log.count("watch") == 1
    assert not {"reset", "replace_workers", "relaunch"} & set(job.log.names())


def test_a_failed_rank_is_not_retried_without_retry_rank_failures(run_fake):
    job = run_fake(rank_fails(2), retries=2)

    assert job.log.count("watch") == 1 and "reset" not in job.log.names()
    assert job.result.exit_code == 1


def test_a_failed_rank_is_retried_on_the_same_workers_with_retry_rank_failures(run_fake):
    job = run_fake(rank_fails(2), succeeds(), retries=1, retry_rank_failures=True)

    # nothing to replace, and mpirun runs here: the same workers and context file serve again
    assert job.log.between(("watch", 1), ("start", 2), skip=NOISE) == ["lost_workers", "reset", "relaunch", "start"]
    assert job.log.count("wait_ready") == 1
    assert job.result.exit_code == 0
    assert "relaunching on the same workers (attempt 1: rank 2 on worker job-worker-1" in job.stderr.getvalue()


def test_a_launcher_in_the_cluster_is_waited_for_again_on_a_rank_retry(run_fake):
    job = run_fake(rank_fails(2), succeeds(), retries=1, retry_rank_failures=True, launcher_in_cluster=True)

    assert job.log.between(("watch", 1), ("start", 2), skip=NOISE) == [
        "lost_workers",
        "reset",
        "relaunch",
        "wait_ready",
        "exec_context",
        "start",
    ]


@pytest.mark.parametrize(
    "outcome, code, options",
    [
        (misplaced(3), EXIT_PLACEMENT, {}),
        (times_out(), EXIT_TIMEOUT, {"timeout": 0.05}),
    ],
    ids=["misplaced", "timeout"],
)
def test_misplaced_ranks_and_timeouts_are_never_retried(run_fake, outcome, code, options):
    job = run_fake(outcome, succeeds(), retries=3, retry_rank_failures=True, **options)

    assert job.log.count("watch") == 1 and "reset" not in job.log.names()
    assert job.result.exit_code == code


def test_every_attempt_shares_the_one_timeout_deadline(run_fake):
    job = run_fake(loses(LOST, "Evicted"), succeeds(), retries=1, timeout=60)

    [(first,), (second,)] = job.log.args("watch")
    assert first is not None and second == first  # --timeout bounds the whole job, retries included


def test_a_replacement_that_never_gets_ready_fails_the_job_with_exit_3(run_fake):
    job = run_fake(
        loses(LOST, "Evicted"),
        backend=Script(wait_ready={2: AllocationError("pod Pending: no node")}),
        retries=1,
        raises=AllocationError,
    )

    assert job.error.exit_code == EXIT_ALLOCATION
    assert job.log.count("start") == 1 and job.log.count("release") == 1
    assert [a["exit_code"] for a in job.report()["attempts"]] == [EXIT_WORKER_LOST]
