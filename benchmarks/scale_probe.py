#!/usr/bin/env python3
"""Where a many-worker local launch differs from the floor: wall time and whole-tree CPU, per variant.

    python benchmarks/scale_probe.py [--workers 32,256] [--runs 3] [--mpi PATH] [--json FILE]

bench_scale.py says how much slower mpilaunch is than the floor; this says why, in
one short run (made for the lent 16-core machine, where the two differ most). Each
launch's CPU is the rusage of its whole process tree: this script is its
subreaper, so a daemon that outlives mpirun (the floor's do) is reparented here
and reaped too, and ``RUSAGE_CHILDREN`` counts it. "CPU-bound" and "waiting"
tell apart:

* ``mpilaunch``: as bench_scale runs it (``-q``, 1 rank per worker, ``true``);
* ``mpilaunch, no OMPI_MCA_plm``: the same with ``OMPI_MCA_plm`` taken out of the
  environment (an image's ``isolated`` reaches the daemons through the agents;
  only differs where it is set);
* ``floor``: plain mpirun with the ``/bin/sh`` agent (benchmarks/floor.py);
* ``floor, a session per daemon``: the floor's agent runs each daemon under
  ``setsid -w``, as mpilaunch's agents do (each daemon its own session, so its
  own scheduling autogroup where ``kernel.sched_autogroup_enabled`` is 1).

Runs are interleaved; medians are printed with each variant's ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_scale import launch, mpilaunch_command
from floor import REPO, floor_command

from mpilaunch import mpi
from mpilaunch.agent.proctree import PR_SET_CHILD_SUBREAPER, prctl

SESSION_AGENT_LINE = 'exec /bin/sh -c "$*"'


def variants(info: mpi.MpiInfo, workers: int, tmp: Path) -> dict[str, tuple[list[str], dict, Path]]:
    ours = mpilaunch_command(info, workers, ["true"], name="probe")
    no_plm = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_plm"}
    floor_dir, session_dir = tmp / "floor", tmp / "session"
    floor_dir.mkdir(exist_ok=True)
    session_dir.mkdir(exist_ok=True)
    floor = floor_command(info, floor_dir, workers=workers, slots=1, command=["true"], name="probe")
    session = floor_command(info, session_dir, workers=workers, slots=1, command=["true"], name="probe")
    agent = session_dir / "sh-agent"
    text = agent.read_text()
    assert SESSION_AGENT_LINE in text, "floor.SH_AGENT changed: update scale_probe"
    agent.write_text(text.replace(SESSION_AGENT_LINE, 'exec setsid -w /bin/sh -c "$*"'))
    return {
        "mpilaunch": (ours, dict(os.environ), REPO),
        "mpilaunch, no OMPI_MCA_plm": (ours, no_plm, REPO),
        "floor": (floor.argv, {**os.environ, **floor.env}, floor_dir),
        "floor, a session per daemon": (session.argv, {**os.environ, **session.env}, session_dir),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="32,256", help="worker counts, comma-separated (default 32,256)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved launches per variant (default 3)")
    ap.add_argument("--mpi", default="/usr/bin/mpirun", help="the mpirun to measure (default /usr/bin/mpirun)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a launch counts as a stall")
    ap.add_argument("--json", metavar="FILE", help="also write every result here")
    args = ap.parse_args()
    if not prctl(PR_SET_CHILD_SUBREAPER, 1):
        print("warning: not a subreaper: daemons that outlive mpirun are not counted", file=sys.stderr)
    info = mpi.find_mpirun("auto", args.mpi)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in [int(w) for w in args.workers.split(",") if w]:
            cases = variants(info, workers, Path(tmp))
            results: dict[str, list[dict]] = {name: [] for name in cases}
            for i in range(args.runs + 1):  # the first round warms the caches and is not counted
                for name, (argv, env, cwd) in cases.items():
                    r = launch(argv, env, cwd=cwd, timeout=args.timeout, tree_cpu=True)
                    print(f"  {workers} workers, run {i}: {name}: {r['s']:.2f} s, CPU {r['cpu_s']} s"
                          f"{' STALL' if r['stalled'] else ''}{' rc=%s' % r['code'] if r['code'] else ''}",
                          file=sys.stderr, flush=True)
                    if i:
                        results[name].append(r)
            floor_s = statistics.median(r["s"] for r in results["floor"])
            for name, runs in results.items():
                cpu = [r["cpu_s"] for r in runs if r["cpu_s"] is not None]
                rows.append({"workers": workers, "variant": name, "median_s": statistics.median(r["s"] for r in runs),
                             "median_cpu_s": statistics.median(cpu) if cpu else None,
                             "ratio": round(statistics.median(r["s"] for r in runs) / floor_s, 2), "runs": runs})
    print(f"\n{info.flavour} {info.version}, {os.cpu_count()} cores; whole-tree CPU from wait4\n")
    print("| workers | variant | median wall s | median CPU s | wall ratio to the floor |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['variant']} | {r['median_s']:.2f} | {r['median_cpu_s']} | {r['ratio']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"mpi": f"{info.flavour} {info.version}", "cpus": os.cpu_count(),
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
