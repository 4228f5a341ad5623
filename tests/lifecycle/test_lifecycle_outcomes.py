"""What a job's exit code and failure text say, for each way ``lifecycle.run_job`` can end.

The codes come from ``mpilaunch.core.exit_codes``; the texts are the ones a user
reads: the failed rank, the misplaced rank and its hint, the lost worker with
where it lived and what ran there, the timeout.
"""

from __future__ import annotations

import time

from mpilaunch.core.errors import AllocationError
from mpilaunch.core.exit_codes import EXIT_ALLOCATION, EXIT_PLACEMENT, EXIT_TIMEOUT, EXIT_WORKER_LOST
from support.fake_backend import Script
from support.fake_workload import loses, misplaced, rank_fails, runs_until_stopped, succeeds, times_out

LOST = "job-worker-1"


def test_a_failed_rank_gives_its_own_exit_code_and_names_rank_and_worker(run_fake):
    job = run_fake(rank_fails(2, code=7))

    assert job.result.exit_code == 7
    assert job.result.failure.splitlines()[0] == "rank 2 on worker job-worker-1 exited with code 7"
    assert job.log.args("lost_workers") == [(True,)]  # a failed job asks once more whether a worker is gone


def test_a_misplaced_rank_exits_with_the_placement_code_and_a_hint(run_fake):
    job = run_fake(misplaced(3))

    assert job.result.exit_code == EXIT_PLACEMENT
    first, hint = job.result.failure.split("\n", 1)
    assert first.startswith("placement check failed: rank 3 started on the launcher, not in a worker")
    assert hint.startswith("  hint: mpirun did not use mpilaunch-rsh")


def test_a_timeout_exits_124_at_the_deadline_set_from_start(run_fake):
    before = time.monotonic()
    job = run_fake(times_out(), timeout=0.1)

    [(deadline,)] = job.log.args("watch")
    assert before + 0.1 <= deadline <= time.monotonic()
    assert job.result.exit_code == EXIT_TIMEOUT
    assert job.result.failure == "the job ran past --timeout 0.1s and was stopped"


def test_a_timeout_stops_the_workload_at_once_saying_why_while_the_workers_are_held(run_fake):
    job = run_fake(times_out(), timeout=0.05)

    assert job.log.args("note_stop") == [("at --timeout 0.05s",)]
    names = job.log.names()
    # the stop follows the watch at once (where a diagnosis may go), before anything is released
    assert names[names.index("watch") + 1 : names.index("watch") + 3] == ["note_stop", "stop"]
    assert names.index("stop") < names.index("job_finished") < names.index("release")
    assert job.result.timings["run_s"] >= 0.05


def test_a_rank_exiting_124_before_the_deadline_is_not_stopped_as_a_timeout(run_fake):
    job = run_fake(rank_fails(1, code=EXIT_TIMEOUT), timeout=60)

    assert job.result.exit_code == EXIT_TIMEOUT
    assert job.log.args("note_stop") == []
    assert job.result.failure.startswith("rank 1 on worker")


def test_no_timeout_means_no_deadline(run_fake):
    job = run_fake(succeeds())

    assert job.log.args("watch") == [(None,)]


def test_a_lost_worker_exits_5_naming_worker_place_reason_and_ranks(run_fake):
    job = run_fake(loses(LOST, "Evicted: The node was low on resource: memory"))

    assert job.result.exit_code == EXIT_WORKER_LOST
    lines = job.result.failure.splitlines()
    assert lines[0] == (
        "worker job-worker-1 (pod job-worker-1 on node node-1) was lost: "
        "Evicted: The node was low on resource: memory; ranks 2-3 ran there"
    )
    assert lines[1] == "mpirun was stopped by mpilaunch after worker job-worker-1 was lost"  # what mpirun made of it


def test_the_watch_stops_the_workload_as_soon_as_a_worker_is_lost(run_fake):
    job = run_fake(loses(LOST, "Evicted"))

    assert job.log.args("note_stop") == [("after worker job-worker-1 was lost",)]
    names = job.log.names()
    assert names.index("stop") < names.index("job_finished")
    assert "lost_workers" not in names  # seen during the run: no second question


def test_a_loss_mpirun_noticed_first_is_found_by_asking_once_more(run_fake):
    job = run_fake(loses(LOST, "OOMKilled (exit 137)", noticed="mpirun"))

    assert job.log.args("lost_workers") == [(True,)]
    assert job.result.exit_code == EXIT_WORKER_LOST
    assert job.result.failure.splitlines() == [
        "worker job-worker-1 (pod job-worker-1 on node node-1) was lost: OOMKilled (exit 137); ranks 2-3 ran there",
        "mpirun exited with code 255 before any rank failed",
    ]


def test_a_success_with_every_rank_reported_asks_nothing_more(run_fake):
    job = run_fake(succeeds())

    assert "lost_workers" not in job.log.names()
    assert job.result.exit_code == 0


def test_a_success_with_unreported_ranks_on_a_lost_worker_is_a_lost_worker(run_fake):
    def exit_0_without_ranks_2_3(wl, run, deadline):
        run.backend.lose(LOST, "its agent was killed by SIGKILL", settle_only=True)
        return succeeds(unreported=(2, 3))(wl, run, deadline)

    job = run_fake(exit_0_without_ranks_2_3)

    assert job.log.args("lost_workers") == [(True,)]
    assert job.result.exit_code == EXIT_WORKER_LOST
    assert job.result.failure.startswith("worker job-worker-1 (pod job-worker-1 on node node-1) was lost: its agent")


def test_a_timeout_is_not_blamed_on_a_worker_lost_meanwhile(run_fake):
    def worker_goes_then_timeout(wl, run, deadline):
        run.backend.lose(LOST, "Evicted", settle_only=True)
        return times_out()(wl, run, deadline)

    job = run_fake(worker_goes_then_timeout, timeout=0.05)

    assert job.result.exit_code == EXIT_TIMEOUT
    assert "lost_workers" not in job.log.names()


def test_a_backend_that_cannot_watch_any_more_stops_the_run_with_exit_3(run_fake):
    refused = AllocationError("the API server refused the credentials (401)", "check your kubeconfig")
    job = run_fake(runs_until_stopped(), backend=Script(lost_workers=refused), raises=AllocationError)

    assert job.error is refused and job.error.exit_code == EXIT_ALLOCATION
    assert job.log.args("note_stop") == [("after the API server refused the credentials (401)",)]


def test_a_flaky_lost_worker_question_is_no_verdict(run_fake):
    job = run_fake(
        loses(LOST, "Evicted"), backend=Script(lost_workers={1: OSError("timed out"), 2: ConnectionResetError()})
    )

    assert job.backend.polls >= 3  # asked again after each error
    assert job.result.exit_code == EXIT_WORKER_LOST
