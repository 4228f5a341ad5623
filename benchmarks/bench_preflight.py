#!/usr/bin/env python3
"""--preflight's cost: seconds from workers ready to the verdict, at 4, 8 and 16 local workers.

Runs, for each size N in --sizes, ``--runs`` times, interleaved:

    mpilaunch --np N --slots-per-worker 1 --preflight report --output-dir D -- true

and reads report.json's ``preflight.seconds`` (the whole check: the probe sent to every worker
through its agent, all at once, each worker's three kernel runs, the judgement) and
``preflight.medians.kernel_s``. On this machine all workers share its cores, so the probes'
kernels run side by side on 2 cores: the figure grows with N here, and the per-worker share of it
is what a real cluster (a node per worker) pays only on the launcher's side.

The model for 256 and 1024 workers (one node each): the probe's own time on one node (its
Python start-up and the best of three kernel runs, measured here with one worker) plus the
launcher's serial share per worker (one exec session each, started from one thread each: the
slope between the sizes measured here, minus the kernels that a node per worker runs in
parallel), capped by the 20 s deadline; plus the link test (its mpirun's launch as measured here,
then one link at a time at 10 GB/s and 20 us, with the retries of a slow one). Target (issue 52):
at most 10 s at 16 workers here; the goal at 256 nodes is 60 s.

    python benchmarks/bench_preflight.py --sizes 1,4,8,16 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from floor import REPO

MIB = 1 << 20


def one_run(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "mpilaunch", "--np", str(workers), "--slots-per-worker", "1", "-q",
                "--preflight", "report", "--output-dir", out, "--", "true"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
        env["MPILAUNCH_STATE_DIR"] = out
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"mpilaunch exited {done.returncode}: {done.stderr[-2000:]}")
        checked = json.loads((Path(out) / "report.json").read_text())["preflight"]
        medians = checked["medians"]
        return {"seconds": checked["seconds"], "kernel_s": medians.get("kernel_s", 0.0),
                "links_s": medians.get("link_test_s", 0.0), "link_gbps": medians.get("link_gbps"),
                "findings": len(checked["findings"])}  # fmt: skip


def model(per_size: dict[int, dict]) -> dict:
    """Seconds at 256 and 1024 workers, a node each (see the module's docstring)."""
    sizes = sorted(per_size)
    big, small = sizes[-1], sizes[0]
    # the probes' part: the whole preflight less its link test (which has a model of its own below)
    probe_s = {n: per_size[n]["seconds"] - per_size[n]["links_s"] for n in sizes}
    alone = probe_s[small]
    slope = (probe_s[big] - probe_s[small]) / max(1, big - small)
    # the kernels ran side by side on 2 cores here; on a node each they overlap entirely
    kernel_share = 3 * per_size[sizes[0]]["kernel_s"] / 2
    serial = max(0.0, slope - kernel_share)
    probes = {n: min(20.0, alone + serial * n) for n in (256, 1024)}
    # the link test: its mpirun's launch (measured beside the links here, counted whole: a real
    # launch of N daemons has its own figure, BENCHMARKS.md's scale rows) plus one link at a time,
    # each 1 MiB and back, 3 times, then up to 12 times more for a slow one: at 10 GB/s and 20 us a
    # message that is 4 x 3 x 0.12 ms a link, here measured at this machine's loopback speed instead
    # (one worker has no link test: the fit starts at the smallest size that has one)
    linked = [n for n in sizes if n > 1] or [big]
    links_at = {n: per_size[n]["links_s"] for n in linked}
    first = linked[0]
    link_slope = max(0.0, (links_at[big] - links_at[first]) / max(1, big - first))
    launch = max(0.0, links_at[first] - link_slope * first)
    per_link_real = 4 * 3 * (MIB / 10e9 + 20e-6)
    links = {n: launch + per_link_real * n for n in (256, 1024)}
    return {n: round(probes[n] + links[n], 2) for n in (256, 1024)} | {
        "serial_per_worker_s": round(serial, 4),
        "link_test_launch_s": round(launch, 3),
        "link_slope_here_s": round(link_slope, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,8,16")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    got: dict[int, list[dict]] = {n: [] for n in sizes}
    for _ in range(args.runs):  # interleaved: the machine's load falls on every size alike
        for n in sizes:
            got[n].append(one_run(n))
    per_size = {}
    load = os.getloadavg()[0]
    print(f"preflight, local workers, {args.runs} runs each, load {load:.1f}")
    print("workers  preflight s (median, max)  of it the link test s  kernel median s  link GB/s  findings")
    for n in sizes:
        secs = [r["seconds"] for r in got[n]]
        per_size[n] = {"seconds": statistics.median(secs), "kernel_s": statistics.median(r["kernel_s"] for r in got[n]),
                       "links_s": statistics.median(r["links_s"] for r in got[n])}  # fmt: skip
        rates = [r["link_gbps"] for r in got[n] if r["link_gbps"]]
        print(f"{n:7d}  {per_size[n]['seconds']:6.2f} {max(secs):6.2f}            {per_size[n]['links_s']:6.2f}"
              f"                 {per_size[n]['kernel_s']:.3f}           {statistics.median(rates) if rates else 0:5.2f}"
              f"      {sum(r['findings'] for r in got[n])}")  # fmt: skip
    print("model (a node per worker):", json.dumps(model(per_size)))


if __name__ == "__main__":
    main()
