#!/usr/bin/env python3
"""What the no-tool hang fallback costs (issue 42): the stacks sitecustomize in every rank's Python.

1. Start-up per rank: ``python -c pass`` with and without the rank wrapper's
   PYTHONPATH (``rank.with_stacks_site``: mpilaunch's sitecustomize first, which
   arms faulthandler and then runs the one it hides). Alternated runs, medians.
2. Collection at --timeout: a local job of NP ranks, one sleeping before the
   allreduce (tests/programs/hang.py), stacks taken by py-spy and by the
   faulthandler (MPILAUNCH_PY_SPY=none); report.json's ``hang.collection_s``
   and whether the verdict named the sleeping rank.

    PYTHONPATH=<mpi4py> python benchmarks/bench_hang_fallback.py [--mpirun PATH] [--np 4] [--runs 3]
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

from mpilaunch import rank  # noqa: E402

HANG = REPO / "tests" / "programs" / "hang.py"


def startup(runs: int) -> dict:
    """Median wall time of ``python -c pass`` without and with the stacks site."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with_site = dict(env, PYTHONPATH=rank.with_stacks_site(None))
    times: dict[str, list[float]] = {"plain": [], "stacks_site": []}
    for _ in range(runs):
        for key, e in (("plain", env), ("stacks_site", with_site)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=e, check=True)
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return {
        "plain_ms": round(med["plain"], 2),
        "stacks_site_ms": round(med["stacks_site"], 2),
        "added_ms": round(med["stacks_site"] - med["plain"], 2),
        "runs": runs,
    }


def collection(mpirun: str | None, np: int, py_spy: bool) -> tuple[float, bool]:
    """(report.json's collection_s, whether the verdict named the sleeping rank) of one hung job."""
    odd = np - 1
    with tempfile.TemporaryDirectory() as out:
        argv = [
            sys.executable,
            "-m",
            "mpilaunch",
            "-q",
            "--name",
            f"bench-hang-fb-{os.getpid()}",
            "--np",
            str(np),
            "--slots-per-worker",
            "2",
            "--timeout",
            "8",
            "--output-dir",
            out,
        ]
        argv[3:3] = ["--mpirun", mpirun] if mpirun else []
        env = dict(os.environ)
        if not py_spy:
            env["MPILAUNCH_PY_SPY"] = "none"
        subprocess.run(
            argv + ["--", sys.executable, str(HANG), "sleep", str(odd)],
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=300,
        )
        hang = json.loads(Path(out, "report.json").read_text())["hang"]
    return hang["collection_s"], hang["odd_ranks"] == [odd]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpirun")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="hung jobs per tool")
    ap.add_argument("--startup-runs", type=int, default=40)
    args = ap.parse_args()
    result = {"startup": startup(args.startup_runs), "np": args.np}
    for tool, py_spy in (("py-spy", True), ("faulthandler", False)):
        runs = [collection(args.mpirun, args.np, py_spy) for _ in range(args.runs)]
        result[tool] = {
            "collection_s_median": round(statistics.median(r[0] for r in runs), 3),
            "collection_s": [r[0] for r in runs],
            "named_right": sum(r[1] for r in runs),
            "runs": len(runs),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
