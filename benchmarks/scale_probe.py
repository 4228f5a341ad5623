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

``--daemon-context`` first compares what one daemon starts with on each side: a
2-worker launch each, Open MPI's launch agent (``orted``/``prted``) run through a
``/bin/sh`` wrapper that records the daemon's environment, command line, limits,
CPU and memory affinity, cgroup, session, nice value and open descriptors; every
line that differs is printed (values of secret-looking variables masked). The
timeline on the lent machine put the difference after the daemons start
(BENCHMARKS.md, "256, 512 and 1024 workers"): this is what a daemon could see
differently there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from bench_scale import launch, mpilaunch_command
from floor import REPO, floor_command

from mpilaunch.agent.proctree import PR_SET_CHILD_SUBREAPER, prctl
from mpilaunch.core import mpi

SESSION_AGENT_LINE = 'exec /bin/sh -c "$*"'
# Runs as Open MPI's launch agent in place of the daemon: records the daemon's context, then execs it.
CONTEXT_AGENT = """#!/bin/sh
out="{out}/$$"
fds=$(for fd in 0 1 2; do echo "fd$fd $(readlink /proc/$$/fd/$fd)"; done)
{{ env | sort | sed 's/^/env /'
  echo "argv $*"
  ulimit -a | sed 's/^/limit /'
  grep -E '^(Cpus_allowed_list|Mems_allowed_list|NoNewPrivs|Seccomp):' /proc/$$/status | sed 's/^/status /'
  sed 's/^/cgroup /' /proc/$$/cgroup
  # the session (and so the scheduling autogroup, where kernel.sched_autogroup_enabled is 1) it is in
  echo "session leader $(ps -o comm= -p "$(ps -o sid= -p $$ | tr -d ' ')")"
  echo "nice $(ps -o ni= -p $$ | tr -d ' ')"
  echo "oom_score_adj $(cat /proc/$$/oom_score_adj)"
  echo "open fds $(ls /proc/$$/fd | wc -l)"
  echo "$fds"
}} > "$out" 2>&1
exec {daemon} "$@"
"""
# Secret-looking variables are masked; temporary paths, pipe/socket inodes and the numbers in the
# command line (ports, job ids) differ on every launch and are masked too.
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
_TMP_PATH = re.compile(r"/tmp/[^\s:;,'\"]*")
_INODE = re.compile(r"\[\d+\]")


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


def context_lines(text: str) -> set[str]:
    """A daemon's recorded context, with what differs on every launch masked (``_TMP_PATH``...)."""
    lines = set()
    for line in text.splitlines():
        name = line.split("=", 1)[0]
        if line.startswith("env ") and any(word in name.upper() for word in _SECRET_WORDS):
            line = name + "=<masked>"
        line = _INODE.sub("[N]", _TMP_PATH.sub("<tmp>", line))
        if line.startswith("argv "):  # the same options in another order are the same command line
            options = re.split(r" (?=-)", re.sub(r"\d+", "N", line[len("argv ") :]))
            line = "argv " + " ".join(sorted(options))
        lines.add(line)
    return lines


def daemon_context(info: mpi.MpiInfo, tmp: Path, timeout: float) -> dict[str, set[str]]:
    """What the first daemon of a 2-worker launch starts with, mpilaunch's and the floor's."""
    daemon = Path(info.path).parent / ("prted" if info.major >= 5 else "orted")
    parameter = ("--prtemca", "prte_launch_agent") if info.major >= 5 else ("--mca", "orte_launch_agent")
    found = {}
    for side in ("mpilaunch", "floor"):
        out = tmp / f"context-{side}"
        out.mkdir()
        agent = tmp / f"context-agent-{side}"
        agent.write_text(CONTEXT_AGENT.format(out=out, daemon=daemon))
        agent.chmod(0o755)
        flags = (*parameter, str(agent))
        if side == "mpilaunch":
            argv, env, cwd = mpilaunch_command(info, 2, ["true"], flags, name="probe"), dict(os.environ), REPO
        else:
            floor = floor_command(info, out, workers=2, slots=1, command=["true"], extra_args=flags, name="probe")
            argv, env, cwd = floor.argv, {**os.environ, **floor.env}, out
        result = launch(argv, env, cwd=cwd, timeout=timeout)
        records = sorted((p for p in out.iterdir() if p.is_file() and p.name.isdigit()), key=lambda p: int(p.name))
        if result["code"] or not records:
            raise SystemExit(f"{side}: the context launch failed (rc {result['code']}, {len(records)} records)")
        found[side] = context_lines(records[0].read_text())
    return found


def print_context_difference(found: dict[str, set[str]]) -> None:
    ours, floor = found["mpilaunch"], found["floor"]
    print("\nA daemon's context, where the two differ (- floor only, + mpilaunch only):")
    for line in sorted(floor - ours):
        print(f"  - {line}")
    for line in sorted(ours - floor):
        print(f"  + {line}")
    if ours == floor:
        print("  (no difference)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="32,256", help="worker counts, comma-separated (default 32,256)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved launches per variant (default 3)")
    ap.add_argument("--mpi", default="/usr/bin/mpirun", help="the mpirun to measure (default /usr/bin/mpirun)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a launch counts as a stall")
    ap.add_argument("--json", metavar="FILE", help="also write every result here")
    ap.add_argument(
        "--daemon-context",
        action="store_true",
        help="first print how one daemon's context differs between the two sides (Open MPI)",
    )
    args = ap.parse_args()
    if not prctl(PR_SET_CHILD_SUBREAPER, 1):
        print("warning: not a subreaper: daemons that outlive mpirun are not counted", file=sys.stderr)
    info = mpi.find_mpirun("auto", args.mpi)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.daemon_context and info.flavour == "openmpi":
            print_context_difference(daemon_context(info, Path(tmp), args.timeout))
        for workers in [int(w) for w in args.workers.split(",") if w]:
            cases = variants(info, workers, Path(tmp))
            results: dict[str, list[dict]] = {name: [] for name in cases}
            for i in range(args.runs + 1):  # the first round warms the caches and is not counted
                for name, (argv, env, cwd) in cases.items():
                    r = launch(argv, env, cwd=cwd, timeout=args.timeout, tree_cpu=True)
                    print(
                        f"  {workers} workers, run {i}: {name}: {r['s']:.2f} s, CPU {r['cpu_s']} s"
                        f"{' STALL' if r['stalled'] else ''}{' rc=%s' % r['code'] if r['code'] else ''}",
                        file=sys.stderr,
                        flush=True,
                    )
                    if i:
                        results[name].append(r)
            floor_s = statistics.median(r["s"] for r in results["floor"])
            for name, runs in results.items():
                cpu = [r["cpu_s"] for r in runs if r["cpu_s"] is not None]
                rows.append(
                    {
                        "workers": workers,
                        "variant": name,
                        "median_s": statistics.median(r["s"] for r in runs),
                        "median_cpu_s": statistics.median(cpu) if cpu else None,
                        "ratio": round(statistics.median(r["s"] for r in runs) / floor_s, 2),
                        "runs": runs,
                    }
                )
    print(f"\n{info.flavour} {info.version}, {os.cpu_count()} cores; whole-tree CPU from wait4\n")
    print("| workers | variant | median wall s | median CPU s | wall ratio to the floor |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['variant']} | {r['median_s']:.2f} | {r['median_cpu_s']} | {r['ratio']} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"mpi": f"{info.flavour} {info.version}", "cpus": os.cpu_count(), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
