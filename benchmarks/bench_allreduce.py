#!/usr/bin/env python3
"""Allreduce bus bandwidth launched through mpilaunch vs plain mpirun, same ranks.

Both sides run ``allreduce_bw.py`` with 4 ranks on two 2-slot hosts: through
mpilaunch's agents and shim, and through plain mpirun with the same hostfile
layout and a one-line /bin/sh agent. The launcher must not cost bandwidth:
target ratio >= 0.97 at every size (1 MiB and above). Rounds alternate
between the two; each side keeps its best round per size.

``--with-options OPTS`` (repeatable) adds a side: mpilaunch with those
options, in the same rounds, reported against mpilaunch without them; e.g.
``--with-options "--stall-timeout 3"``, whose stall watch then samples every
rank's stacks during the run (the program prints only at its end): what
sampling costs a healthy job.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from floor import REPO, floor_command

from mpilaunch.core import mpi

TARGET_RATIO = 0.97
PROGRAM = str(Path(__file__).resolve().parent / "allreduce_bw.py")


def busbw(argv, env) -> dict[str, float]:
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if "BUSBW " in line:
            return json.JSONDecoder().raw_decode(line.split("BUSBW ", 1)[1])[0]["busbw_GBps"]
    raise SystemExit(f"no result ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def best_of(runs: list[dict]) -> dict[str, float]:
    return {size: max(r[size] for r in runs) for size in runs[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mpirun")
    ap.add_argument(
        "--with-options",
        action="append",
        default=[],
        metavar="OPTS",
        help="also mpilaunch with these options, e.g. '--stall-timeout 3' (repeatable)",
    )
    args = ap.parse_args()
    info = mpi.find_mpirun("auto", args.mpirun)
    env = dict(os.environ)
    command = [sys.executable, PROGRAM]
    ours, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        floor = floor_command(info, Path(tmp), workers=2, slots=2, command=command)
        ours_argv = [
            sys.executable,
            "-m",
            "mpilaunch",
            "-q",
            "--mpirun",
            info.path,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--",
            *command,
        ]
        with_argvs = {
            opts: [*ours_argv[: -len(command) - 1], *shlex.split(opts), "--", *command] for opts in args.with_options
        }
        withs: dict[str, list] = {opts: [] for opts in with_argvs}
        for _ in range(args.rounds):
            ours.append(busbw(ours_argv, env))
            base.append(busbw(floor.argv, {**env, **floor.env}))
            for opts, argv in with_argvs.items():
                withs[opts].append(busbw(argv, env))
    ours_best, base_best = best_of(ours), best_of(base)
    ratios = {size: round(ours_best[size] / base_best[size], 3) for size in ours_best}
    print(f"{'size':>6} {'mpilaunch GB/s':>15} {'plain mpirun GB/s':>18} {'ratio':>6}")
    for size in ours_best:
        print(f"{size:>6} {ours_best[size]:>15.3f} {base_best[size]:>18.3f} {ratios[size]:>6.3f}")
    result = {
        "benchmark": "allreduce_busbw",
        "mpi": f"{info.flavour} {info.version}",
        "ranks": 4,
        "rounds": args.rounds,
        "mpilaunch": ours_best,
        "plain_mpirun": base_best,
        "ratio": ratios,
        "target_ratio": TARGET_RATIO,
    }
    for opts, runs in withs.items():
        best = best_of(runs)
        against = {size: round(best[size] / ours_best[size], 3) for size in best}
        print(
            f"mpilaunch {opts}: "
            + ", ".join(f"{size} {best[size]:.3f} GB/s ({against[size]:.3f}x without)" for size in best)
        )
        result.setdefault("with_options", {})[opts] = {"busbw_GBps": best, "ratio_to_without": against}
    print(json.dumps(result))
    return 0 if min(ratios.values()) >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
