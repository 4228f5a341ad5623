"""report.json as ``lifecycle.run_job`` writes it into --output-dir: attempts, lost workers, the outcome.

Read back from disk, as a user's tooling reads it.
"""

from __future__ import annotations

from mpilaunch.core.errors import AllocationError
from mpilaunch.core.exit_codes import EXIT_ALLOCATION, EXIT_WORKER_LOST
from support.fake_backend import Script
from support.fake_workload import loses, rank_fails, succeeds

LOST = "job-worker-1"


def test_attempts_record_each_try_in_order(run_fake):
    job = run_fake(loses(LOST, "Evicted"), succeeds(), retries=2)

    first, second = job.report()["attempts"]
    assert first == {
        **first,
        "attempt": 1,
        "exit_code": EXIT_WORKER_LOST,
        "lost_workers": [LOST],
        "failure": "worker job-worker-1 (pod job-worker-1 on node node-1) was lost: Evicted; ranks 2-3 ran there",
    }
    assert second == {**second, "attempt": 2, "exit_code": 0, "failure": None, "lost_workers": []}
    assert 0 <= first["started_s"] <= first["ended_s"] <= second["started_s"] <= second["ended_s"]
    assert set(first) == {"attempt", "started_s", "ended_s", "exit_code", "failure", "lost_workers", "ranks"}


def test_an_attempts_failure_is_its_first_line(run_fake):
    job = run_fake(rank_fails(2), rank_fails(1, code=3), retries=1, retry_rank_failures=True)

    assert [(a["exit_code"], a["failure"]) for a in job.report()["attempts"]] == [
        (1, "rank 2 on worker job-worker-1 exited with code 1"),
        (3, "rank 1 on worker job-worker-0 exited with code 3"),
    ]
    assert job.report()["exit_code"] == 3  # the last attempt's outcome is the job's


def test_no_attempts_without_retries(run_fake):
    report = run_fake(succeeds()).report()

    assert "attempts" not in report
    assert report["mode"] == "fake" and report["exit_code"] == 0


def test_the_lost_workers_are_listed_with_their_facts(run_fake):
    report = run_fake(loses(LOST, "Evicted")).report()

    assert report["lost_workers"] == [LOST]
    assert report["lost"] == [
        {"worker": LOST, "reason": "Evicted", "where": "pod job-worker-1 on node node-1", "units": "ranks 2-3"}
    ]
    assert report["exit_code"] == EXIT_WORKER_LOST


def test_a_replaced_worker_stays_in_the_report_of_a_retried_job(run_fake):
    report = run_fake(loses(LOST, "Evicted"), succeeds(), retries=1).report()

    assert report["exit_code"] == 0
    assert report["attempts"][0]["lost_workers"] == [LOST]


def test_an_allocation_failure_still_writes_the_report(run_fake):
    job = run_fake(backend=Script(allocate=AllocationError("quota exceeded")), raises=AllocationError, retries=1)

    report = job.report()
    assert report["exit_code"] == EXIT_ALLOCATION and report["failure"] == "quota exceeded"
    assert report["attempts"] == []
    assert report["workers"] == job.backend.describe_workers()
