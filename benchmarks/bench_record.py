#!/usr/bin/env python3
"""What the job record and the closing summary cost the end of a launch, at N workers.

    python benchmarks/bench_record.py --workers 4 1024

A model, not a launch: a report shaped as the mpirun workload writes it (N
workers x ``--slots`` ranks, every rank with its start and end, the workers'
facts, the phases), then the steps the lifecycle's teardown adds for it, each
timed on its own (medians of ``--runs``): the common fields, the ledger and
the workers' phases (``timings.workers``),
encoding report.json once, writing it into a state directory that already
holds ``MPILAUNCH_KEEP_RECORDS`` records (so each write prunes one) and the
summary's text. ``bench_e2e.py --against REV`` measures the whole launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpilaunch.core import phases as phases_of
from mpilaunch.runtime import record, summary


def model_report(workers: int, slots: int) -> dict:
    """A report of a successful job of ``workers`` x ``slots`` ranks, as run_job builds it."""
    ranks = workers * slots
    now = time.time()
    phases = {
        "allocated": 0.3,
        "workers_ready": 2.0,
        "mpirun_started": 2.01,
        "first_rank_start": 4.0,
        "first_output": 4.1,
        "ranks_done": 30.0,
        "workload_done": 31.0,
        "released": 33.0,
    }
    return {
        "mode": "mpirun",
        "job": "model",
        "backend": "k8s",
        "command": ["python", "train.py", "--epochs", "1"],
        "mpi": {"flavour": "openmpi", "version": "5.0.8", "mpirun": "/usr/bin/mpirun"},
        "plan": {
            "job_name": "model",
            "ranks": ranks,
            "gpus": ranks,
            "workers": [{"name": f"model-worker-{i}", "slots": slots, "gpus": slots} for i in range(workers)],
        },
        "workers": {
            f"model-worker-{i}": {
                "pod": f"model-worker-{i}",
                "namespace": "default",
                "node": f"node-{i}",
                "pod_ip": f"10.0.{i // 256}.{i % 256}",
                "phase": "Running",
                "gpus": slots,
                "image": "registry.example/horovod:0.28.1",
                "image_id": "registry.example/horovod@sha256:" + "ab" * 32,
            }
            for i in range(workers)
        },
        "exit_code": 0,
        "failure": None,
        "ranks": [
            {
                "rank": r,
                "worker": f"model-worker-{r // slots}",
                "exit_code": 0,
                "oom_killed": False,
                "unobserved": None,
                "started_at": record.iso_utc(now - 30),
                "ended_at": record.iso_utc(now - 3),
            }
            for r in range(ranks)
        ],
        "placement": {"verified": True, "ranks": ranks},
        "timings": {
            "allocate_s": 2.0,
            "run_s": 29.0,
            "total_s": 33.0,
            "phases": phases,
            # each worker's own phases (timings.workers), as a Kubernetes job's: all four
            "workers": {
                f"model-worker-{i}": {"created": 0.3, "scheduled": 0.4, "running": 1.5, "ready": 2.0}
                for i in range(workers)
            },
        },
        "environment": None,
        "lost_workers": [],
        "lost": [],
    }


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 2)


def measure(workers: int, slots: int, runs: int, keep: int) -> dict:
    body = model_report(workers, slots)
    with tempfile.TemporaryDirectory() as tmp:
        env = {record.STATE_DIR_ENV: tmp}
        wall = time.time()
        for i in range(keep):  # a full state directory: every write below prunes the oldest
            record.keep({"job": f"old-{i}", "exit_code": 0}, env, keep, wall - 86400 + i)
        seen = {w: {p: 100.0 + at for p, at in t.items()} for w, t in body["timings"]["workers"].items()}
        # the lifecycle turns each worker's monotonic moments into seconds since the start
        fields = median_ms(
            lambda: (
                record.common_fields(body, wall - 33, wall),
                summary.ledger(body),
                phases_of.since_by_worker(100.0, seen),
            ),
            runs,
        )
        report = {**record.common_fields(body, wall - 33, wall), **body, "ledger": summary.ledger(body)}
        encode = median_ms(lambda: record.report_text(report), runs)
        text = record.report_text(report)
        stamps = iter(range(10**6))
        write = median_ms(lambda: record.keep(report, env, keep, wall + next(stamps)), runs)
        lines = median_ms(lambda: summary.lines(report, "/state/runs/model/report.json"), runs)
        kept = len(record.sorted_runs(record.runs_dir(env)))
    total = fields + encode + write + lines
    return {
        "workers": workers,
        "ranks": workers * slots,
        "report_kb": round(len(text) / 1024, 1),
        "fields_and_ledger_ms": fields,
        "encode_ms": encode,
        "write_and_prune_ms": write,
        "summary_ms": lines,
        "total_ms": round(total, 2),
        "records_left": kept,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 128, 1024])
    ap.add_argument("--slots", type=int, default=1, help="ranks per worker (default 1)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--keep", type=int, default=record.DEFAULT_KEEP)
    args = ap.parse_args()
    results = [measure(n, args.slots, args.runs, args.keep) for n in args.workers]
    for r in results:
        print(
            f"{r['workers']:5d} workers ({r['ranks']} ranks, report {r['report_kb']} KiB): "
            f"fields+ledger {r['fields_and_ledger_ms']} ms, encode {r['encode_ms']} ms, "
            f"write+prune {r['write_and_prune_ms']} ms, summary {r['summary_ms']} ms: total {r['total_ms']} ms"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
