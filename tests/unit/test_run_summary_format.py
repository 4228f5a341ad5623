"""The closing summary's text, from a report alone (mpilaunch/runtime/summary.py): pure functions.

The jobs that print it for real are tests/e2e/local/test_run_summary.py.
"""

from mpilaunch.runtime import summary

PHASES = {
    "allocated": 0.31,
    "workers_ready": 0.45,
    "mpirun_started": 0.46,
    "first_rank_start": 0.9,
    "first_output": 1.0,  # a moment, not a boundary
    "ranks_done": 2.8,
    "workload_done": 2.9,
    "released": 3.2,
}


def mpirun_report(**over):
    report = {
        "mode": "mpirun",
        "job": "bench",
        "backend": "local",
        "exit_code": 0,
        "failure": None,
        "mpi": {"flavour": "openmpi", "version": "5.0.8", "mpirun": "/v/bin/mpirun"},
        "plan": {"ranks": 4, "workers": [{"name": "bench-worker-0"}, {"name": "bench-worker-1"}]},
        "nodes": ["localhost"],
        # total_s counts from the allocation; the summary's time is the phases' (planning included)
        "timings": {"total_s": 2.89, "phases": PHASES},
    }
    return {**report, **over}


def test_run_summary_says_where_the_time_went_segment_by_segment():
    spent = summary.time_spent(PHASES)
    assert [label for label, _ in spent] == [
        "allocate",
        "ready",
        "mpirun",
        "wire-up",
        "run",
        "mpirun exit",
        "release",
    ]
    assert round(sum(s for _, s in spent), 3) == 3.2  # the segments add up to the last phase
    assert dict(spent)["run"] == 2.8 - 0.9


def test_run_summary_of_a_success_names_ranks_workers_nodes_mpi_and_record():
    lines = summary.lines(mpirun_report(), "/state/runs/bench-20261206T233500Z/report.json")
    assert lines[0] == "mpilaunch: job bench succeeded in 3.20s"
    assert lines[1] == "  4 ranks on 2 workers; 1 node: localhost; Open MPI 5.0.8; backend local"
    assert lines[2].startswith("  time: allocate 0.31s, ready 0.14s, mpirun 0.01s, wire-up 0.44s, run 1.90s")
    assert lines[3] == "  record: /state/runs/bench-20261206T233500Z/report.json"
    assert len(lines) == 4


def test_run_summary_of_a_failure_names_the_failing_rank_first():
    failure = "rank 3 on worker bench-worker-1 exited with code 7\nlast 2 lines of rank 3:\n  | boom"
    lines = summary.lines(mpirun_report(exit_code=7, failure=failure))
    assert (
        lines[0] == "mpilaunch: job bench failed (exit 7) in 3.20s: rank 3 on worker bench-worker-1 exited with code 7"
    )
    assert not any("boom" in line for line in lines)  # the error line that follows shows the tail


def test_run_summary_quiet_is_one_line():
    ok = summary.one_line(mpirun_report(), "/r/report.json")
    assert ok == "mpilaunch: job bench succeeded in 3.20s: 4 ranks on 2 workers; record: /r/report.json"
    failed = summary.one_line(mpirun_report(exit_code=5, failure="worker bench-worker-0 was lost: x\ny"))
    assert failed == "mpilaunch: job bench failed (exit 5) in 3.20s: worker bench-worker-0 was lost: x"
    assert "\n" not in ok + failed


def test_run_summary_of_a_ps_job_keeps_its_task_table():
    report = {
        "mode": "ps",
        "job": "psjob",
        "backend": "local",
        "exit_code": 0,
        "plan": {"ranks": 0, "workers": [{}, {}]},
        "nodes": ["localhost"],
        "tasks": [
            {"task": "ps:0", "address": "127.0.0.1:4000", "status": "terminated", "exit_code": None, "duration_s": 2.0},
            {"task": "worker:0", "address": "127.0.0.1:4001", "status": "succeeded", "exit_code": 0, "duration_s": 1.5},
        ],
        "timings": {
            "total_s": 2.5,
            "phases": {"allocated": 0.2, "workers_ready": 0.4, "workload_done": 2.3, "released": 2.5},
        },
    }
    lines = summary.lines(report, "/r/report.json")
    assert lines[0] == "mpilaunch: PS job psjob succeeded in 2.50s"
    assert lines[1] == "  2 tasks on 2 workers; 1 node: localhost; backend local"
    assert lines[2].split() == ["ps:0", "127.0.0.1:4000", "terminated", "2.0s"]
    assert lines[3].split() == ["worker:0", "127.0.0.1:4001", "succeeded", "1.5s"]
    assert lines[4] == "  time: allocate 0.20s, ready 0.20s, run 1.90s, release 0.20s"


def test_run_summary_of_a_job_that_never_ran_says_until_released():
    report = mpirun_report(
        exit_code=3,
        failure="workers not ready",
        timings={"total_s": 30.0, "phases": {"allocated": 0.2, "released": 30.0}},
    )
    assert summary.time_spent(report["timings"]["phases"]) == [("allocate", 0.2), ("until released", 29.8)]


def test_run_summary_names_a_few_nodes_and_counts_the_rest():
    assert summary.nodes_text([f"n{i}" for i in range(16)]) == "16 nodes: n0, n1, n2, ..."
    assert summary.nodes_text([]) is None


def test_run_summary_side_by_side_compares_the_key_numbers():
    a = mpirun_report()
    b = mpirun_report(exit_code=7, timings={"total_s": 3.89, "phases": {**PHASES, "released": 4.2}})
    lines = summary.side_by_side(a, b)
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["exit"].split() == ["exit", "0", "7"]
    assert rows["total"].split() == ["total", "3.20s", "4.20s", "(+1.00s,", "+31%)"]
    assert rows["release"].split()[1:3] == ["0.30s", "1.30s"]
    assert rows["mpi"].split() == ["mpi", "Open", "MPI", "5.0.8", "Open", "MPI", "5.0.8"]


def test_run_summary_ledger_splits_the_worker_seconds_held():
    book = summary.ledger(mpirun_report())
    assert book["unit"] == "worker_seconds" and book["count"] == 2
    assert book["allocated"] == round(2 * (3.2 - 0.31), 3)
    assert book["start"] == round(2 * (0.45 - 0.31), 3)
    assert book["wire_up"] == round(2 * (0.9 - 0.45), 3)
    assert book["program"] == round(2 * (2.8 - 0.9), 3)
    assert book["release"] == round(2 * (3.2 - 2.8), 3)  # mpirun's teardown after the ranks, and the release
    parts = ("queue", "start", "wire_up", "program", "hang", "failed_attempts", "release")
    assert round(sum(book[k] for k in parts), 3) == book["allocated"]
    line = summary.ledger_line(book)
    assert line.startswith("  ledger: 5.8 worker-s held: start 0.3 (5%), wire-up 0.9 (16%), program 3.8 (66%)")


def test_run_summary_ledger_counts_gpu_seconds_queueing_hangs_and_failed_attempts():
    phases = {
        "allocated": 1.0,
        "pods_scheduled": 11.0,  # 10 s waiting for the scheduler
        "containers_running": 41.0,
        "workers_ready": 42.0,
        "first_rank_start": 43.0,
        "workload_done": 143.0,
        "released": 145.0,
    }
    report = mpirun_report(
        plan={"ranks": 16, "gpus": 16, "workers": [{}, {}]},
        timings={"total_s": 145.0, "phases": phases},
        attempts=[{"started_s": 42.0, "ended_s": 80.0}, {"started_s": 90.0, "ended_s": 143.0}],
        hang={"stall_timeout_s": 30.0},
    )
    book = summary.ledger(report)
    assert book["unit"] == "gpu_seconds" and book["count"] == 16
    assert book["queue"] == 16 * 10.0 and book["start"] == 16 * 31.0
    assert book["failed_attempts"] == 16 * 48.0  # from the first attempt's start to the last one's
    assert book["hang"] == 16 * 30.0 and book["program"] == 16 * (101.0 - 48.0 - 30.0)
    assert book["release"] == 16 * 2.0
    assert "GPU-s held: queue 160.0 (7%)" in summary.ledger_line(book)
    assert summary.ledger({"timings": {"phases": {}}}) is None
