"""What a detached job's launcher posts for `mpilaunch wait` to print as the closing summary (pure).

``summary.compact`` keeps what ``summary.lines`` reads, small whatever the
job's size; on YARN it travels as the last line of the application's final
diagnostics (``yarn/outcome.py``), on Kubernetes in result.json. The jobs
that post and print it for real are tests/e2e/k8s/test_run_summary_detached.py
and tests/e2e/yarn/test_yarn_detach.py -k run_summary.
"""

from __future__ import annotations

import json

from mpilaunch.backends.yarn import outcome as yo
from mpilaunch.runtime import summary

PHASES = {"allocated": 0.1, "workers_ready": 1.5, "first_rank_start": 2.0, "ranks_done": 9.0, "released": 9.5}


def big_report(workers=1024, code=0, failure=None):
    """A report of 8192 ranks on ``workers`` workers on as many nodes, with everything per rank a report has."""
    names = [f"big-worker-{i}" for i in range(workers)]
    report = {
        "schema_version": 1,
        "mpilaunch_version": "0.1.0",
        "started_at": "2026-12-07T12:00:00.000Z",
        "ended_at": "2026-12-07T12:00:09.500Z",
        "nodes": [f"node-{i:04d}" for i in range(workers)],
        "mode": "mpirun",
        "job": "big",
        "backend": "k8s",
        "command": ["python3", "train.py"],
        "mpi": {"flavour": "openmpi", "version": "4.1.4", "mpirun": "/usr/bin/mpirun"},
        "image": "org/horovod:1",
        "image_digest": "sha256:" + "a" * 64,
        "plan": {"job_name": "big", "ranks": 8 * workers, "gpus": 8 * workers,
                 "workers": [{"name": n, "slots": 8, "gpus": 8} for n in names]},
        "workers": {n: {"node": f"node-{i:04d}"} for i, n in enumerate(names)},
        "exit_code": code,
        "failure": failure,
        "ranks": [{"rank": r, "worker": names[r // 8], "exit_code": 0} for r in range(8 * workers)],
        "timings": {"allocate_s": 1.4, "run_s": 8.0, "total_s": 9.4, "phases": PHASES,
                    "workers": {n: {"created": 0.1, "ready": 1.5} for n in names}},
    }  # fmt: skip
    report["ledger"] = summary.ledger(report)
    return report


def test_run_summary_compact_reads_as_the_whole_report():
    for report in (big_report(), big_report(workers=1), big_report(code=7, failure="rank 3 on worker w exited\nlast")):
        posted = summary.compact(report)
        assert summary.lines(posted) == summary.lines(report)
        assert summary.one_line(posted) == summary.one_line(report)


def test_run_summary_compact_stays_small_at_1024_workers():
    report = big_report()
    posted = summary.compact(report)
    assert len(json.dumps(report)) > 500_000
    assert len(json.dumps(posted)) < 1500, len(json.dumps(posted))
    assert posted["plan"] == {"ranks": 8192, "gpus": 8192, "workers": 1024}
    assert posted["nodes"] == ["node-0000", "node-0001", "node-0002"] and posted["node_count"] == 1024
    assert "1024 nodes: node-0000, node-0001, node-0002, ..." in summary.lines(posted)[1]
    assert "ranks" not in posted and "workers" not in posted and "workers" not in posted["timings"]


def test_run_summary_travels_in_yarn_diagnostics_after_the_outcome():
    posted = summary.compact(big_report(code=7, failure="rank 3 on worker big-worker-0 exited with code 7"))
    diag = yo.diagnostics(
        7, "rank 3 on worker big-worker-0 exited with code 7", "container_1_01_000004", "nm:8042", posted
    )
    first, log, facts = diag.split("\n")
    assert first == "mpilaunch: exit 7: rank 3 on worker big-worker-0 exited with code 7"
    assert log == "launcher log: container_1_01_000004 on nm:8042" and facts.startswith(yo.SUMMARY_PREFIX)
    assert yo.outcome("FINISHED", "FAILED", diag) == ("FAILED", 7, "rank 3 on worker big-worker-0 exited with code 7")
    assert yo.launcher_log(diag) == ("container_1_01_000004", "nm:8042")
    assert yo.summary_facts(diag) == posted


def test_run_summary_missing_or_cut_in_yarn_diagnostics_is_none():
    assert yo.summary_facts(yo.diagnostics(0, None, "c", "nm:1")) is None  # an older launcher's
    posted = summary.compact(big_report())
    cut = yo.diagnostics(0, None, "c", "nm:1", posted)[:-40]  # the ResourceManager kept less
    assert yo.summary_facts(cut) is None
    assert yo.outcome("FINISHED", "SUCCEEDED", cut) == ("SUCCEEDED", 0, None)
    assert yo.summary_facts(None) is None
