#!/usr/bin/env python3
"""Peak memory of the launcher side of a job: the mpilaunch process, mpirun and one shim per worker.

    mpilaunch --np N --slots-per-worker 1 -- sleep S           (local backend, N local agents)

for N in --workers (16,64,256) and each MPI in --mpi. With direct spawn (mpilaunch sets
``plm_rsh_no_tree_spawn``) mpirun keeps one ``mpilaunch-rsh`` shim per worker alive for the whole
run, so the launcher's memory grows with the job: this is what the Kubernetes launcher pod's
default memory (``backends/k8s/resources.py``, ``launcher_memory_mib``) is sized from.

Every --interval (0.1 s) the process tree under the mpilaunch process is walked (through
``/proc/PID/task/*/children``) and each process is put in one group:

  mpilaunch  the mpilaunch process itself (the CLI; in Kubernetes the launcher pod's lifecycle)
  mpirun     mpirun and what it runs that is not a shim (Open MPI 5: prterun)
  shim       a process whose command line names mpilaunch-rsh or rsh_agent (one per worker)
  other      anything else the mpilaunch process runs (none expected)

The local agents (comm or command line ``mpilaunch.agent``) and everything under them (daemons,
rank wrappers, ranks) are left out: in Kubernetes those are the worker pods. Each process's
RSS, USS and PSS (psutil ``memory_full_info``, from ``/proc/PID/smaps_rollup``) and page tables
(``VmPTE``) are summed per sample; the peak of each sum over the run is reported, with the
shims' count and per-shim average at the sample where the shims' RSS sum peaked.

Reading the numbers: RSS counts the pages the shims share (the interpreter, libpython, libc)
once per shim, an upper bound; PSS splits shared pages among their users and is what a memory
cgroup holding exactly these processes comes closest to (plus kernel memory: page tables,
sockets). The mpilaunch process here forks the local agents, which share its pages, so its
PSS is too low for a launcher pod: use its RSS (or --k8s-import, below).

Also, unless --skip-alone:
  one shim alone  the launcher script mpilaunch points mpirun at, connected to one real agent
                  (TLS, as every job's) and running ``sleep``, sampled the same way
  imports         RSS/USS of a fresh interpreter after importing the local CLI
                  (``mpilaunch.cli``) and the launcher pod's entry point
                  (``mpilaunch.backends.k8s.in_cluster.launcher``)

"Estimated charge": the shims' USS, the pages they share counted once, the mpilaunch and mpirun
RSS and the page tables: what a memory cgroup holding just these processes (the launcher pod) is
charged, short of kernel objects /proc does not show (tasks, kernel stacks, sockets).

Then a least-squares line ``peak = a + b * workers`` over the measured sizes per MPI and metric,
its value at the sizes not measured (--extrapolate, default 256,512,1024), and a comparison with
``launcher_memory_mib``. A launch that does not end within --timeout is killed with everything it
started and reported as a stall; its peak is still recorded (the shims it had are real).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
from bench_scale import MARK, installed_mpis, mpilaunch_command, raise_limits, sweep
from floor import REPO

from mpilaunch.backends.k8s.resources import launcher_memory_mib
from mpilaunch.core import mpi

MIB = 1024.0 * 1024.0
GROUPS = ("mpilaunch", "mpirun", "shim", "other")
METRICS = ("rss", "uss", "pss", "pte")
MPIRUN_NAMES = ("mpirun", "mpiexec", "orterun", "prterun", "prte")  # and names that start so: mpirun.openmpi


def is_mpirun(name: str) -> bool:
    return name.startswith(MPIRUN_NAMES)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), from /proc; [] once it is gone."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


class Walker:
    """Groups the launcher-side processes under one root; remembers each pid's identity."""

    def __init__(self, root: int):
        self.root = root
        self.known: dict[int, psutil.Process] = {}
        self.root_cmdline = None

    def _identify(self, pid: int, parent_group: str | None) -> tuple[str, psutil.Process] | None:
        """Its group, from its name and command line read now (a forked child that has not
        exec'd yet still has its parent's; it is looked at again next time)."""
        proc = self.known.get(pid)
        try:
            if proc is None or not proc.is_running():
                proc = self.known[pid] = psutil.Process(pid)
            name, argv = proc.name(), proc.cmdline()
        except psutil.Error:
            return None
        cmdline = " ".join(argv)
        if pid == self.root:
            group = "mpilaunch"
            self.root_cmdline = cmdline
        elif parent_group == "mpilaunch" and (
            "mpilaunch.agent" in name or "mpilaunch.agent" in cmdline or cmdline == self.root_cmdline
        ):
            group = "agent"  # exec'd (its launcher's name), or forked from the CLI (its command line)
        elif (
            parent_group == "shim"
            or name == "mpilaunch-rsh"
            or any(os.path.basename(a) == "mpilaunch-rsh" or a.startswith("mpilaunch.rsh_agent") for a in argv[:4])
        ):
            group = "shim"
        elif parent_group == "mpirun" or is_mpirun(name) or bool(argv) and is_mpirun(os.path.basename(argv[0])):
            group = "mpirun"  # by name first: its own command line names the shim (plm_ssh_agent)
        else:
            group = "other"
        return group, proc

    def walk(self) -> tuple[dict[int, tuple[str, psutil.Process]], int]:
        """{pid: (group, process)} of the launcher side now, and how many agents were left out."""
        found: dict[int, tuple[str, psutil.Process]] = {}
        agents = 0
        stack: list[tuple[int, str | None]] = [(self.root, None)]
        while stack:
            pid, parent_group = stack.pop()
            hit = self._identify(pid, parent_group)
            if hit is None:
                continue
            if hit[0] == "agent":
                agents += 1  # and nothing under it: daemons, rank wrappers and ranks are the workers'
                continue
            found[pid] = hit
            stack.extend((c, hit[0]) for c in children(pid))
        return found, agents


def memory(proc: psutil.Process) -> dict[str, float] | None:
    try:
        info = proc.memory_full_info()
        with open(f"/proc/{proc.pid}/status") as f:
            pte = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmPTE:")), 0)
    except (psutil.Error, OSError):
        return None
    return {"rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", 0), "pte": pte}


class Sampler(threading.Thread):
    """Samples the launcher side of one launch until stopped; keeps the peaks."""

    def __init__(self, root: int, interval: float, expect_shims: int | None = None):
        super().__init__(daemon=True)
        self.walker = Walker(root)
        self.interval = interval
        self.expect_shims = expect_shims
        self.stop = threading.Event()
        self.samples = 0
        self.peak_total = dict.fromkeys(METRICS, 0.0)  # the peak of each sum over all groups
        self.peak_group = {g: dict.fromkeys(METRICS, 0.0) for g in GROUPS}
        self.peak_count = dict.fromkeys(GROUPS, 0)
        self.max_agents = 0
        self.at_shim_peak: dict = {}  # the sample where the shims' RSS sum peaked
        self.all_shims_s = None  # seconds from start until the expected number of shims ran
        self.t0 = time.monotonic()
        self.sample_s: list[float] = []

    def sample(self) -> None:
        t = time.monotonic()
        found, agents = self.walker.walk()
        sums = {g: dict.fromkeys(METRICS, 0.0) for g in GROUPS}
        counts = dict.fromkeys(GROUPS, 0)
        shim_rss = []
        for group, proc in found.values():
            m = memory(proc)
            if m is None:
                continue
            counts[group] += 1
            for k in METRICS:
                sums[group][k] += m[k]
            if group == "shim":
                shim_rss.append(m["rss"])
        self.samples += 1
        self.max_agents = max(self.max_agents, agents)
        for k in METRICS:
            self.peak_total[k] = max(self.peak_total[k], sum(sums[g][k] for g in GROUPS))
        for g in GROUPS:
            self.peak_count[g] = max(self.peak_count[g], counts[g])
            for k in METRICS:
                self.peak_group[g][k] = max(self.peak_group[g][k], sums[g][k])
        if counts["shim"] and sums["shim"]["rss"] >= self.at_shim_peak.get("shim_rss", 0):
            self.at_shim_peak = {
                "t_s": round(t - self.t0, 2),
                "shims": counts["shim"],
                "shim_rss": sums["shim"]["rss"],
                "per_shim": {k: sums["shim"][k] / counts["shim"] for k in METRICS},
                "shim_rss_min": min(shim_rss),
                "shim_rss_max": max(shim_rss),
                "groups": {g: {**sums[g], "n": counts[g]} for g in GROUPS},
            }
        if self.expect_shims and self.all_shims_s is None and counts["shim"] >= self.expect_shims:
            self.all_shims_s = round(t - self.t0, 2)
        self.sample_s.append(time.monotonic() - t)

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            self.sample()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - start)))

    def result(self) -> dict:
        mib = lambda d: {k: round(v / MIB, 2) for k, v in d.items()}  # noqa: E731
        shim = self.at_shim_peak
        return {
            "samples": self.samples,
            "sample_ms_median": round(1000 * sorted(self.sample_s)[len(self.sample_s) // 2], 1)
            if self.sample_s
            else None,
            "peak_mib": mib(self.peak_total),
            "peak_group_mib": {g: mib(v) for g, v in self.peak_group.items()},
            "peak_count": self.peak_count,
            "agents_left_out": self.max_agents,
            "all_shims_s": self.all_shims_s,
            "at_shim_peak": {
                "t_s": shim.get("t_s"),
                "shims": shim.get("shims", 0),
                "per_shim_mib": mib(shim.get("per_shim", {})),
                "shim_rss_min_mib": round(shim.get("shim_rss_min", 0) / MIB, 2),
                "shim_rss_max_mib": round(shim.get("shim_rss_max", 0) / MIB, 2),
                "groups_mib": {
                    g: {**mib({k: v for k, v in d.items() if k != "n"}), "n": d["n"]}
                    for g, d in shim.get("groups", {}).items()
                },
            },
        }


def one_launch(info: mpi.MpiInfo, workers: int, sleep_s: float, interval: float, timeout: float) -> dict:
    argv = mpilaunch_command(info, workers, ["sleep", str(sleep_s)], name="benchmem")
    launch_id = uuid.uuid4().hex
    env = {**os.environ, MARK: launch_id}
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        sampler = Sampler(proc.pid, interval, expect_shims=workers)
        sampler.start()
        try:
            code, stalled = proc.wait(timeout), False
        except subprocess.TimeoutExpired:
            code, stalled = None, True
        sampler.stop.set()
        sampler.join()
        if stalled:
            os.killpg(proc.pid, 9)
            proc.wait()
        elapsed = time.monotonic() - t0
        left = sweep(launch_id)
        tail = ""
        if stalled or code:
            out.seek(0)
            tail = out.read().decode(errors="replace")[-800:]
    result = {
        "workers": workers,
        "s": round(elapsed, 2),
        "code": code,
        "stalled": stalled,
        "left": left,
        "load_before": round(load, 1),
        "load_after": round(os.getloadavg()[0], 1),
        **sampler.result(),
    }
    if tail:
        result["output_tail"] = tail
    return result


def shim_alone(sleep_s: float, interval: float) -> dict:
    """One shim (the per-job ``python -IS`` launcher) to one real TLS agent, running ``sleep``."""
    import bench_shim

    from mpilaunch.rsh_agent import shim

    with tempfile.TemporaryDirectory(prefix="bench-launcher-memory-") as d:
        tmp = Path(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        agent, address, secret = bench_shim.start_agent(tmp, env)
        try:
            context = tmp / "context.json"
            context.write_text(
                json.dumps(
                    {
                        "job": "bench",
                        "transport": "agent",
                        "secret_file": str(secret),
                        "forward_env": ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH"],
                        "workers": {"w0": {"address": address}},
                    }
                )
            )
            env["MPILAUNCH_CONTEXT"] = str(context)
            launcher = shim.write_launcher(str(tmp / "mpilaunch-rsh"))
            argv = [launcher, "-x", "w0", "sleep", str(sleep_s)]
            subprocess.run(argv[:3] + ["true"], env=env, check=True)  # .pyc files, page cache
            peaks = dict.fromkeys(METRICS, 0.0)
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
            p = psutil.Process(proc.pid)
            samples = 0
            while proc.poll() is None:
                m = memory(p)
                if m:
                    samples += 1
                    for k in METRICS:
                        peaks[k] = max(peaks[k], m[k])
                time.sleep(interval)
            gnu_peak, how = bench_shim.peak_rss_mb(argv[:3] + ["true"], env, 3, tmp)
        finally:
            agent.terminate()
            agent.wait()
    return {
        "samples": samples,
        "peak_mib": {k: round(v / MIB, 2) for k, v in peaks.items()},
        "maxrss_true_mib": round(gnu_peak, 2),
        "maxrss_source": how,
    }


def import_footprint(module: str) -> dict:
    """RSS and USS (MiB) of a fresh interpreter (with site, as a console script or -m runs) after one import."""
    code = (
        "import importlib, json, psutil, sys; importlib.import_module(sys.argv[1]); "
        "m = psutil.Process().memory_full_info(); print(json.dumps([m.rss, m.uss]))"
    )
    code_base = "import json, psutil; m = psutil.Process().memory_full_info(); print(json.dumps([m.rss, m.uss]))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rss, uss = json.loads(
        subprocess.run([sys.executable, "-c", code, module], env=env, check=True, capture_output=True, text=True).stdout
    )
    rss0, uss0 = json.loads(
        subprocess.run([sys.executable, "-c", code_base], env=env, check=True, capture_output=True, text=True).stdout
    )
    return {
        "rss_mib": round(rss / MIB, 2),
        "uss_mib": round(uss / MIB, 2),
        "over_bare_rss_mib": round((rss - rss0) / MIB, 2),
    }


def estimated_charge(run: dict) -> float:
    """MiB a memory cgroup holding exactly the launcher side would be charged, from /proc: the shims'
    USS, the pages they share once (one shim's RSS - USS), the mpilaunch and mpirun RSS (a launcher pod
    has no agents to share the mpilaunch process's pages with), and every page table."""
    shim = run["at_shim_peak"]
    per = shim["per_shim_mib"]
    if not shim["shims"]:
        return 0.0
    groups = run["peak_group_mib"]
    return round(
        shim["shims"] * per["uss"]
        + (per["rss"] - per["uss"])
        + groups["mpilaunch"]["rss"]
        + groups["mpirun"]["rss"]
        + run["peak_mib"]["pte"],
        1,
    )


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares ``y = a + b x``; None below two distinct sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="16,64,256", help="worker counts, comma-separated (default 16,64,256)")
    ap.add_argument(
        "--mpi",
        default="openmpi5,openmpi4",
        help="comma-separated: openmpi4 (Debian's), openmpi5 (PyPI's, skipped when missing), "
        "or mpirun paths (default openmpi5,openmpi4)",
    )
    ap.add_argument(
        "--runs", type=int, default=2, help="launches per MPI and size; the highest peak counts (default 2)"
    )
    ap.add_argument("--sleep", type=float, default=5.0, help="seconds each rank sleeps (default 5)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    ap.add_argument(
        "--timeout",
        type=float,
        help="seconds per launch before it counts as a stall (default max(60, workers / 2 + 2 * sleep))",
    )
    ap.add_argument(
        "--extrapolate",
        default="256,512,1024",
        help="worker counts to give the fitted line's value at, where not measured (default 256,512,1024)",
    )
    ap.add_argument("--skip-alone", action="store_true", help="skip the one-shim and import measurements")
    ap.add_argument("--json", metavar="FILE", help="also write every result here ('-': stdout)")
    args = ap.parse_args()
    sizes = [int(w) for w in args.workers.split(",") if w]
    limits = raise_limits(max(sizes))
    infos = installed_mpis(args.mpi)
    compileall.compile_dir(str(REPO / "mpilaunch"), quiet=1)  # as `pip install .` leaves it

    extras = {}
    if not args.skip_alone:
        extras["shim_alone"] = shim_alone(args.sleep, args.interval)
        print(f"one shim alone: {extras['shim_alone']}", file=sys.stderr, flush=True)
        extras["imports"] = {
            m: import_footprint(m) for m in ("mpilaunch.cli", "mpilaunch.backends.k8s.in_cluster.launcher")
        }
        print(f"imports: {extras['imports']}", file=sys.stderr, flush=True)

    rows = []
    for info in infos:
        for workers in sizes:
            timeout = args.timeout or max(60.0, workers / 2 + 2 * args.sleep)
            print(
                f"{info.flavour} {info.version}, {workers} workers, sleep {args.sleep:g}:", file=sys.stderr, flush=True
            )
            runs = []
            for i in range(args.runs):
                r = one_launch(info, workers, args.sleep, args.interval, timeout)
                runs.append(r)
                s = r["at_shim_peak"]
                print(
                    f"    run {i + 1}/{args.runs}: {r['s']:.1f}s{' STALL' if r['stalled'] else ''}"
                    f"{' rc=%s' % r['code'] if r['code'] else ''}, peak RSS {r['peak_mib']['rss']:.1f} MiB, "
                    f"PSS {r['peak_mib']['pss']:.1f}, USS {r['peak_mib']['uss']:.1f}; {s['shims']} shims "
                    f"({s['per_shim_mib'].get('rss', 0):.2f} MiB RSS each), {r['agents_left_out']} agents left out, "
                    f"{r['samples']} samples (load {r['load_before']} -> {r['load_after']})",
                    file=sys.stderr,
                    flush=True,
                )
                if r.get("output_tail"):
                    print("      " + r["output_tail"].replace("\n", "\n      "), file=sys.stderr, flush=True)
            complete = [r for r in runs if r["at_shim_peak"]["shims"] >= workers] or runs
            best = max(complete, key=lambda r: r["peak_mib"]["rss"])
            rows.append(
                {
                    "mpi": f"{info.flavour} {info.version}",
                    "mpirun": info.path,
                    "workers": workers,
                    "complete": any(r["at_shim_peak"]["shims"] >= workers for r in runs),
                    "peak": best,
                    "runs": runs,
                }
            )

    print(
        "\n| MPI | workers | shims seen | peak RSS MiB | peak PSS MiB | peak USS MiB | page tables MiB "
        "| per shim RSS / PSS / USS MiB | mpilaunch RSS | mpirun RSS | estimated charge MiB | default (resources.py) MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["peak"]
        s = p["at_shim_peak"]
        ps = s["per_shim_mib"]
        print(
            f"| {r['mpi']} | {r['workers']} | {s['shims']}{'' if r['complete'] else ' (incomplete)'} "
            f"| {p['peak_mib']['rss']:.1f} | {p['peak_mib']['pss']:.1f} | {p['peak_mib']['uss']:.1f} "
            f"| {p['peak_mib']['pte']:.1f} | {ps.get('rss', 0):.2f} / {ps.get('pss', 0):.2f} / {ps.get('uss', 0):.2f} "
            f"| {p['peak_group_mib']['mpilaunch']['rss']:.1f} | {p['peak_group_mib']['mpirun']['rss']:.1f} "
            f"| {estimated_charge(p):.0f} | {launcher_memory_mib(r['workers'])} |"
        )

    fits = {}
    targets = [int(w) for w in args.extrapolate.split(",") if w]
    for name in dict.fromkeys(r["mpi"] for r in rows):
        mine = [r for r in rows if r["mpi"] == name and r["complete"]]
        fits[name] = {}
        for k in ("rss", "pss", "uss", "charge"):
            line = fit(
                [
                    (r["workers"], estimated_charge(r["peak"]) if k == "charge" else r["peak"]["peak_mib"][k])
                    for r in mine
                ]
            )
            if line is None:
                continue
            a, b = line
            fits[name][k] = {
                "base_mib": round(a, 1),
                "per_worker_mib": round(b, 3),
                "at": {w: round(a + b * w, 1) for w in targets},
            }
        for k, f in fits[name].items():
            at = ", ".join(
                f"{w}: {v:.0f} MiB{' (extrapolated)' if w not in {r['workers'] for r in mine} else ''}"
                f" vs default {launcher_memory_mib(w)}"
                for w, v in f["at"].items()
            )
            print(f"{name} {k}: peak = {f['base_mib']:.1f} + {f['per_worker_mib']:.3f} x workers MiB; {at}")
    result = {
        "benchmark": "launcher_memory",
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "limits": limits,
        "sleep_s": args.sleep,
        "interval_s": args.interval,
        "extras": extras,
        "rows": rows,
        "fits": fits,
    }
    if args.json == "-":
        print(json.dumps(result))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    bad = [r for r in rows if not r["complete"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
