#!/usr/bin/env python3
"""Cost of placement verification: the same local launch with and without it.

    mpilaunch --np 4 --slots-per-worker 2 -- python -c pass              (verified)
    mpilaunch --np 4 --slots-per-worker 2 --no-verify -- python -c pass  (not)

Runs alternate (A, B, A, B, ...) so load on the machine hits both alike;
medians are compared. Target: verification adds at most 5% to the local
launch time. Also reported: the check's own time inside mpilaunch
(``timings.verify_s`` of report.json), the pure check at 1024 ranks and the
wrapper's start line, which say what the end-to-end difference is made of.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mpilaunch.core import (  # noqa: E402
    placement,
    rank_lines,
)
from mpilaunch.core.spec import Plan, WorkerPlan  # noqa: E402

TARGET_PCT = 5.0


def timed(argv, env, report: Path | None = None) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {argv}\n{proc.stdout}\n{proc.stderr}")
    verify_s = None
    if report is not None:
        verify_s = json.loads(report.read_text())["timings"].get("verify_s")
    return elapsed, verify_s


def pure_check_cost(ranks: int = 1024, slots: int = 8, reps: int = 20) -> float:
    plan = Plan("b", tuple(WorkerPlan(f"b-worker-{i}", slots, 0) for i in range(ranks // slots)))
    starts = [placement.RankStart(r, r % slots, ranks, f"b-worker-{r // slots}", "h") for r in range(ranks)]
    t0 = time.perf_counter()
    for _ in range(reps):
        assert placement.check(plan, starts, complete=True) is None
    return (time.perf_counter() - t0) / reps


def start_line_cost(reps: int = 2000) -> float:
    """What the wrapper pays per rank for its start line (printed with or without --no-verify)."""
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "MPILAUNCH_WORKER": "b-worker-1",
    }
    with open(os.devnull, "w") as sink:
        t0 = time.perf_counter()
        for _ in range(reps):
            print(rank_lines.format_start(env), file=sink, flush=True)
        return (time.perf_counter() - t0) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--mpirun", help="mpirun to use (default: found like mpilaunch does)")
    args = ap.parse_args()
    env = dict(os.environ)
    base = [sys.executable, "-m", "mpilaunch", "-q", "--np", "4", "--slots-per-worker", "2"]
    if args.mpirun:
        base += ["--mpirun", args.mpirun]
    command = ["--", sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as tmp:
        # both write report.json (and rank logs): only the check differs
        report_dir = Path(tmp) / "out"
        verified = base + ["--output-dir", str(report_dir)] + command
        skipped = base + ["--no-verify", "--output-dir", str(Path(tmp) / "out-no-verify")] + command
        timed(verified, env), timed(skipped, env)  # warm caches
        ours, off, checks = [], [], []
        for _ in range(args.runs):
            elapsed, verify_s = timed(verified, env, report_dir / "report.json")
            ours.append(elapsed)
            checks.append(verify_s)
            off.append(timed(skipped, env)[0])
    result = {
        "benchmark": "placement_verification",
        "runs": args.runs,
        "verified_median_s": round(statistics.median(ours), 4),
        "no_verify_median_s": round(statistics.median(off), 4),
        "in_launcher_check_median_ms": round(statistics.median(checks) * 1000, 3),
        "pure_check_1024_ranks_ms": round(pure_check_cost() * 1000, 3),
        "start_line_per_rank_us": round(start_line_cost() * 1e6, 1),
    }
    diff = result["verified_median_s"] - result["no_verify_median_s"]
    result["cost_pct"] = round(100 * diff / result["no_verify_median_s"], 2)
    result["target_pct"] = TARGET_PCT
    print(f"verified:    median {result['verified_median_s']:.3f}s")
    print(f"--no-verify: median {result['no_verify_median_s']:.3f}s")
    print(
        f"cost {result['cost_pct']:+.2f}% (target <= {TARGET_PCT}%); check inside mpilaunch "
        f"{result['in_launcher_check_median_ms']} ms, pure check at 1024 ranks {result['pure_check_1024_ranks_ms']} ms, "
        f"start line {result['start_line_per_rank_us']} us per rank"
    )
    print(json.dumps(result))
    return 0 if result["cost_pct"] <= TARGET_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
