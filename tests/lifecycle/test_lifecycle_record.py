"""The closing summary and the kept record as ``lifecycle.run_job`` makes them, on every exit path.

The scripted fakes stand for the backend and the workload; the jobs of real MPI are
tests/e2e/local/test_run_summary.py and test_job_record.py.
"""

from __future__ import annotations

import json

from mpilaunch.core.errors import AllocationError
from support.fake_backend import Script
from support.fake_workload import loses, rank_fails, succeeds

LOST = "job-worker-1"


def kept(state) -> list[dict]:
    runs = state / "runs"
    return [json.loads((runs / d / "report.json").read_text()) for d in sorted(runs.iterdir())]


def test_run_summary_of_a_failed_rank_names_it_and_its_record(run_fake, tmp_path):
    state = tmp_path / "state"
    job = run_fake(rank_fails(2, code=7), keep_records=100, environ={"MPILAUNCH_STATE_DIR": str(state)})

    lines = job.stderr.getvalue().splitlines()
    head = next(line for line in lines if line.startswith("mpilaunch: job job "))
    assert " failed (exit 7) in " in head, head
    assert head.endswith(": rank 2 on worker job-worker-1 exited with code 7"), head
    # --output-dir's report.json is the one named; the state directory keeps the same report
    assert lines[-1] == f"  record: {job.output_dir / 'report.json'}"
    assert kept(state) == [job.report()]


def test_run_summary_is_not_printed_for_an_error_raised_before_the_ranks_but_the_record_is_kept(run_fake, tmp_path):
    state = tmp_path / "state"
    job = run_fake(
        backend=Script(allocate=AllocationError("quota exceeded")),
        raises=AllocationError,
        keep_records=100,
        environ={"MPILAUNCH_STATE_DIR": str(state)},
    )

    assert "mpilaunch: job" not in job.stderr.getvalue()  # the CLI prints the error and its hint alone
    [report] = kept(state)
    assert report["exit_code"] == 3 and report["failure"] == "quota exceeded"
    assert report["schema_version"] == 1 and report["started_at"] <= report["ended_at"]


def test_run_summary_ledger_counts_a_failed_attempt(run_fake, tmp_path):
    state = tmp_path / "state"
    job = run_fake(
        loses(LOST, "Evicted"), succeeds(), retries=1, keep_records=100, environ={"MPILAUNCH_STATE_DIR": str(state)}
    )

    book = job.report()["ledger"]
    assert book["failed_attempts"] > 0 and book["wire_up"] == 0  # the last attempt's wire-up is its program's
    parts = ("queue", "start", "wire_up", "program", "hang", "failed_attempts", "release")
    assert abs(sum(book[k] for k in parts) - book["allocated"]) < 0.01, book


def test_job_record_not_kept_by_an_in_cluster_launcher(run_fake, tmp_path):
    """keep_records None: the in-cluster launchers' run_job, whose submitting side keeps the record."""
    state = tmp_path / "state"
    job = run_fake(succeeds(), environ={"MPILAUNCH_STATE_DIR": str(state)})

    assert job.result.exit_code == 0 and "mpilaunch: job" not in job.stderr.getvalue()
    assert not state.exists()
    assert job.report()["schema_version"] == 1  # --output-dir's report has the record's fields too
