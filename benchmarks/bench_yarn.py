"""YARN launch overhead: submit -> all workers ready, ready -> first rank running.

    python benchmarks/bench_yarn.py [--workers 2 8] [--repeat 3] [--workdir DIR]

Starts the YARN testbed (testbeds/yarn, 3 NodeManagers; or attaches to DIR
from ``python -m testbeds.yarn.cluster up --nodemanagers 3 --workdir DIR``)
and runs ``mpilaunch --backend yarn --np W --slots-per-worker 1`` with a rank
program that prints its wall-clock start time first thing. From
``report.json``:

* ``allocate_s``: from the start of the orchestration (before the skein
  driver starts) until every worker's agent answered ``ping``; it includes
  the skein Java driver start, the ApplicationMaster start and the worker
  containers' start;
* ready -> first rank: the earliest rank's start time minus the moment the
  last worker's agent answered ``ping`` (``workers.*.ready_at`` in
  ``report.json``); this is writing the hostfile/context, mpirun start, shim
  + agent session + daemon start, and the rank wrapper's start.

Prints a Markdown table (median and min over the repeats).
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

RANK = "import time, os; print('RANKSTART', repr(time.time()), os.environ.get('MPILAUNCH_WORKER'), flush=True)"


def run_once(env, mpirun, workers, name, outdir):
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "yarn",
        "--mpirun",
        mpirun,
        "--name",
        name,
        "--np",
        str(workers),
        "--slots-per-worker",
        "1",
        "--memory",
        "256 MiB",
        "-q",
        "--output-dir",
        str(outdir),
        "--",
        sys.executable,
        "-c",
        RANK,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    report = json.loads((outdir / "report.json").read_text())
    starts = [
        float(line.split()[1])
        for line in proc.stdout.splitlines()
        if "RANKSTART" in line
        for line in [line[line.index("RANKSTART") :]]
    ]
    assert len(starts) == workers, proc.stdout
    # Each worker's report entry holds the wall-clock time its agent first
    # answered ping; the last of them is "all workers ready".
    ready = max(w["ready_at"] for w in report["workers"].values())
    return {
        "allocate_s": report["timings"]["allocate_s"],
        "first_rank_s": min(starts) - ready,
        "last_rank_s": max(starts) - ready,
        "run_s": report["timings"]["run_s"],
        "total_s": report["timings"]["total_s"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir")
    args = ap.parse_args(argv)

    from testbeds.yarn.cluster import YarnCluster

    own = not (args.workdir and os.path.exists(os.path.join(args.workdir, "state.json")))
    t = time.time()
    yc = YarnCluster(num_nodemanagers=3).start() if own else YarnCluster.attach(args.workdir)
    print(f"cluster ready in {time.time() - t:.1f}s", file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
    env.update(yc.env)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), yc.env["PATH"]])
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    rows = []
    probe = (
        "import time, skein; t = time.time(); "
        "c = skein.Client(log=False, security=skein.Security.new_credentials()); "
        "print(time.time() - t); c.close()"
    )
    driver = [
        float(
            subprocess.run(
                [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True
            ).stdout.split()[-1]
        )
        for _ in range(2)
    ]
    try:
        for workers in args.workers:
            samples = []
            for i in range(args.repeat):
                with tempfile.TemporaryDirectory() as d:
                    s = run_once(env, mpirun, workers, f"bench-w{workers}-{i}", Path(d))
                samples.append(s)
                print(
                    f"workers={workers} run {i}: " + json.dumps({k: round(v, 2) for k, v in s.items()}), file=sys.stderr
                )
            rows.append((workers, samples))
    finally:
        if own:
            yc.stop(graceful=False)
    print(
        "| workers | submit -> all ready (s), median [min] | ready -> first rank (s) | ready -> last rank (s) | job total (s) |"
    )
    print("|---|---|---|---|---|")
    for workers, samples in rows:

        def cell(key):
            values = [s[key] for s in samples]
            return f"{statistics.median(values):.2f} [{min(values):.2f}]"

        print(
            f"| {workers} | {cell('allocate_s')} | {cell('first_rank_s')} | {cell('last_rank_s')} | {cell('total_s')} |"
        )
    print(f"\nskein Java driver start alone (part of submit -> ready): {min(driver):.2f}-{max(driver):.2f} s")


if __name__ == "__main__":
    main()
