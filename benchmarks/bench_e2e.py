#!/usr/bin/env python3
"""End-to-end launch cost: mpilaunch vs the /bin/sh-agent floor, side by side.

    mpilaunch --np 4 --slots-per-worker 2 -- python -c pass
    mpirun (same flags, same two-host hostfile) with a one-line /bin/sh agent

Runs are interleaved (A, B, A, B, ...) so load on the machine hits both
alike. Reports medians and the ratio; exits 1 above the target ratio (2, issue 53).
``--with-options OPTS`` (repeatable) adds mpilaunch with those options to
the interleaving, reported against mpilaunch without them (e.g.
``--with-options "--stall-timeout 30"``: what its stall watch costs a launch).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from floor import REPO, compare_to_floor, floor_command

from mpilaunch.core import mpi

TARGET_RATIO = 2.0  # issue 53 item 4: at most 2x the floor (issue 11 asked 3x)


def timed(argv, env, cwd=REPO, cpu: list | None = None) -> float:
    """Wall seconds of one launch; with ``cpu``, also appends the CPU seconds of it and all it waited
    for (the agents, mpirun, daemons, ranks): on a loaded machine a steadier measure of a cost."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {argv}\n{proc.stdout}\n{proc.stderr}")
    if cpu is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return elapsed


def median_ms(argv, env, runs=15) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 1)


def start_costs(env) -> dict:
    """What one start of each of mpilaunch's Python processes costs, in ms (medians).

    The CLI runs with ``site`` (the user's interpreter, as installed); the
    agents, shims and rank wrappers run ``python -IS`` (``pylauncher``), so
    theirs is the bare interpreter plus their own imports.
    """
    py = sys.executable
    on_path = f"import sys; sys.path.insert(0, {str(REPO)!r}); "
    bare = median_ms([py, "-IS", "-c", "pass"], env)
    with_site = median_ms([py, "-c", "pass"], env)
    costs = {"interpreter_bare_ms": bare, "site_ms": round(with_site - bare, 1)}
    for name, module in (
        (
            "cli_imports",
            "mpilaunch.cli, mpilaunch.job.lifecycle, mpilaunch.workloads.mpirun, mpilaunch.backends.local.backend",
        ),
        ("agent_imports", "mpilaunch.agent.cli"),
        ("shim_imports", "mpilaunch.rsh_agent.shim, mpilaunch.rsh_agent.transports.agent"),
        ("rank_wrapper_imports", "mpilaunch.rank"),
    ):
        flags = ["-c"] if name == "cli_imports" else ["-IS", "-c"]
        base = with_site if name == "cli_imports" else bare
        costs[name + "_ms"] = round(median_ms([py, *flags, on_path + "import " + module], env) - base, 1)
    return costs


def phase_medians(argv, env, directory: Path, runs: int) -> dict:
    """Medians of report.json's timings.phases (seconds since run_spec began) over ``runs`` launches."""
    seen: dict[str, list[float]] = {}
    for i in range(runs):
        out = directory / f"report-{i}"
        timed([*argv[:3], "--output-dir", str(out), *argv[3:]], env)
        phases = json.loads((out / "report.json").read_text())["timings"]["phases"]
        for name, at in phases.items():
            seen.setdefault(name, []).append(at)
    return {name: round(statistics.median(v), 3) for name, v in seen.items() if len(v) == runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--mpirun", help="mpirun to use (default: found like mpilaunch does)")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also where the time goes: report.json's phases (7 more launches, with --output-dir) "
        "and the start-up cost of each kind of Python process",
    )
    ap.add_argument(
        "--against",
        metavar="REV",
        help="also time the same launch from a worktree of this git revision, interleaved in the "
        "same run, and report the difference in percent (e.g. what a change costs the launch)",
    )
    ap.add_argument(
        "--with-options",
        action="append",
        default=[],
        metavar="OPTS",
        help="also time mpilaunch with these options, e.g. '--stall-timeout 30' (repeatable)",
    )
    args = ap.parse_args()
    info = mpi.find_mpirun("auto", args.mpirun)
    # `pip install .` leaves the package byte-compiled; an editable checkout
    # run with PYTHONDONTWRITEBYTECODE=1 (as CI shells often are) would
    # otherwise compile every module on every launch (~25 ms here), which no
    # installed mpilaunch pays.
    compileall.compile_dir(str(REPO / "mpilaunch"), quiet=1)
    env = dict(os.environ)
    command = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as tmp:
        floor = floor_command(info, Path(tmp), workers=2, slots=2, command=command)
        floor_argv, floor_env = floor.argv, {**env, **floor.env}
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
        other = None
        if args.against:
            other = Path(tmp) / "against"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(other), args.against],
                cwd=REPO,
                check=True,
                capture_output=True,
            )
            compileall.compile_dir(str(other / "mpilaunch"), quiet=1)
            timed(ours_argv, env, other)
        timed(ours_argv, env), timed(floor_argv, floor_env)  # warm caches
        ours, base, before, ours_cpu, before_cpu = [], [], [], [], []
        with_argvs = {
            opts: [*ours_argv[: -len(command) - 1], *shlex.split(opts), "--", *command] for opts in args.with_options
        }
        withs: dict[str, tuple[list, list]] = {opts: ([], []) for opts in with_argvs}
        try:
            for _ in range(args.runs):
                ours.append(timed(ours_argv, env, cpu=ours_cpu))
                base.append(timed(floor_argv, floor_env))
                if other is not None:
                    before.append(timed(ours_argv, env, other, cpu=before_cpu))
                for opts, argv in with_argvs.items():
                    withs[opts][0].append(timed(argv, env, cpu=withs[opts][1]))
        finally:
            if other is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO, capture_output=True)
        if args.breakdown:
            phases = phase_medians(ours_argv, env, Path(tmp), runs=7)
            costs = start_costs(env)
    result = compare_to_floor("e2e_launch", info, ours, base, TARGET_RATIO)
    print(f"mpilaunch --np 4 --slots-per-worker 2 -- python -c pass: median {result['mpilaunch_median_s']:.3f}s")
    print(f"mpirun + /bin/sh agent floor (same hostfile):            median {result['floor_median_s']:.3f}s")
    print(f"ratio {result['ratio']} (target <= {TARGET_RATIO})")
    if before:
        then, now = statistics.median(before), statistics.median(ours)
        cpu_then, cpu_now = statistics.median(before_cpu), statistics.median(ours_cpu)
        result["against"] = {
            "rev": args.against,
            "median_s": round(then, 4),
            "change_percent": round(100 * (now - then) / then, 2),
            "cpu_median_s": round(cpu_then, 4),
            "this_tree_cpu_median_s": round(cpu_now, 4),
        }
        print(
            f"the same launch at {args.against}: median {then:.3f}s; this tree "
            f"{result['against']['change_percent']:+.2f}%"
        )
        print(
            f"CPU of a launch (all its processes, medians): {cpu_then:.3f}s at {args.against}, "
            f"{cpu_now:.3f}s this tree ({1000 * (cpu_now - cpu_then):+.0f} ms)"
        )
    for opts, (walls, cpus) in withs.items():
        wall, cpu, now, cpu_now = (
            statistics.median(walls),
            statistics.median(cpus),
            statistics.median(ours),
            statistics.median(ours_cpu),
        )
        result.setdefault("with_options", {})[opts] = {
            "median_s": round(wall, 4),
            "change_percent": round(100 * (wall - now) / now, 2),
            "cpu_median_s": round(cpu, 4),
            "cpu_change_ms": round(1000 * (cpu - cpu_now), 1),
        }
        print(
            f"mpilaunch {opts}: median {wall:.3f}s, {result['with_options'][opts]['change_percent']:+.2f}% "
            f"against without; CPU {cpu:.3f}s ({1000 * (cpu - cpu_now):+.0f} ms)"
        )
    if args.breakdown:
        result["phases_s"], result["start_costs_ms"] = phases, costs
        print("phases (s since mpilaunch began planning, medians): " + ", ".join(f"{k} {v}" for k, v in phases.items()))
        print("start-up costs (ms, medians): " + ", ".join(f"{k[:-3]} {v}" for k, v in costs.items()))
    print(json.dumps(result))
    return 0 if result["ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
