#!/usr/bin/env python3
"""Output relay throughput: a chatty job under mpilaunch vs the /bin/sh-agent floor.

    mpilaunch --np 2 -- python -c 'for i in range(N): print("x" * 40)'
    mpirun (same flags, same two-host hostfile, --tag-output) with a /bin/sh agent

Both print into /dev/null. With ``--output-dir`` mpilaunch also writes the
rank logs (``rank-<i>.log``, flushed at most ``output.LOG_FLUSH_S`` late)
into a temporary directory: what the log writing costs. mpilaunch reads every line of mpirun's output (to
split it per rank and catch the rank wrappers' status lines) before echoing
it; when that reader is slower than mpirun, mpirun's pipe fills and the
ranks block in print(), so the job itself runs longer. Runs alternate;
reports medians and the ratio; exits 1 above the target ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from floor import REPO, compare_to_floor, floor_command

from mpilaunch.core import mpi

TARGET_RATIO = 1.1  # no slower than mpirun alone, with room for noise (15a59b1: 1.13)


def timed(argv, env) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {argv}\n{proc.stderr}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", type=int, default=200_000, help="lines each of the 2 ranks prints")
    ap.add_argument("--mpirun", help="mpirun to use (default: found like mpilaunch does)")
    ap.add_argument(
        "--output-dir",
        action="store_true",
        help="mpilaunch writes the rank logs too (--output-dir in a temporary directory)",
    )
    args = ap.parse_args()
    info = mpi.find_mpirun("auto", args.mpirun)
    command = [sys.executable, "-c", f"for i in range({args.lines}): print('x' * 40)"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        floor = floor_command(info, Path(tmp), workers=2, slots=1, command=command)
        floor_argv, floor_env = floor.argv, {**env, **floor.env}
        ours_argv = [
            sys.executable,
            "-m",
            "mpilaunch",
            "-q",
            "--mpirun",
            info.path,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
        ]
        if args.output_dir:
            ours_argv += ["--output-dir", str(Path(tmp) / "logs")]
        ours_argv += ["--", *command]
        ours, base = [], []
        for _ in range(args.runs):
            shutil.rmtree(Path(tmp) / "logs", ignore_errors=True)  # each run's logs start empty
            ours.append(timed(ours_argv, env))
            base.append(timed(floor_argv, floor_env))
    result = compare_to_floor(
        "output_relay", info, ours, base, TARGET_RATIO, digits=2, lines_total=2 * args.lines, rank_logs=args.output_dir
    )
    print(f"mpilaunch, {2 * args.lines} lines of output:  median {result['mpilaunch_median_s']:.2f}s")
    print(f"mpirun + /bin/sh agent floor (same lines): median {result['floor_median_s']:.2f}s")
    print(f"ratio {result['ratio']} (target <= {TARGET_RATIO})")
    print(json.dumps(result))
    return 0 if result["ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
