#!/usr/bin/env python3
"""Cost of one ``mpilaunch-rsh`` invocation: wall time and peak RSS.

Starts real ``mpilaunch agent``s (one with a job's TLS credential, as every
job has since issue 40, and one with a MAC secret alone, the channel before
it), then runs the shim N times with ``true``
as the remote command, next to the cost floor: a one-line ``/bin/sh`` rsh
agent that runs the command locally (what a fake-host launch costs without
any exec channel).  Each invocation is spawned with ``posix_spawn`` and
reaped with ``wait4``, so its peak RSS is that process's own ``ru_maxrss``.

Peak RSS: ``ru_maxrss`` of a process started by ``posix_spawn`` from this
(larger) Python process includes the spawner's RSS, because Linux folds the
high-water mark of the address space replaced by ``exec`` into it.  So RSS
is taken in a separate pass through GNU ``/usr/bin/time -f %M``, which forks
from a tiny process; without it the upper bound from ``wait4`` is reported.

Variants:
  launcher  the ``python -IS`` launcher from ``shim.write_launcher`` (what
            mpilaunch points mpirun at; skips site-packages .pth files), TLS
  plain     the same launcher to an agent without TLS (frame MACs only),
            measured interleaved with ``launcher``: what TLS costs a shim
  module    ``python -m mpilaunch.rsh_agent.shim`` (same start-up as the
            ``mpilaunch-rsh`` console script: ``site`` and every .pth run)
  python    ``python -IS -c pass``: the interpreter's own start-up floor
  baseline  ``/bin/sh`` one-liner that runs the command locally

Prints a table, the ratio to the baseline, a burst test (``--burst`` shims
started at once, like mpirun fanning out) and one JSON line.  Exits 1 when
the gated variant misses the targets (median <= 60 ms, peak RSS <= 30 MB).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mpilaunch.rsh_agent import shim  # noqa: E402

TARGET_MS = 60.0
TARGET_MB = 30.0


def start_agent(tmp: Path, env: dict, tls: bool = True):
    from mpilaunch.backends.agent_credential import new_credential

    tmp = tmp / ("tls" if tls else "plain")
    tmp.mkdir()
    secret = tmp / "secret"
    secret.write_bytes((new_credential() if tls else os.urandom(24).hex()).encode() + b"\n")
    secret.chmod(0o600)
    addr = tmp / "addr"
    log = open(tmp / "agent.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch.agent",
            "--name",
            "bench-worker-0",
            "--listen",
            "127.0.0.1:0",
            "--address-file",
            str(addr),
            "--secret-file",
            str(secret),
            "--exit-with-pid",
            str(os.getpid()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not addr.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"agent did not start: {(tmp / 'agent.log').read_text()}")
        time.sleep(0.02)
    return proc, addr.read_text(), secret


def spawn(argv: list, env: dict) -> int:
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
            ],
        )
    finally:
        os.close(devnull)


GNU_TIME = "/usr/bin/time"


def measure_once(argv: list, env: dict):
    """(wall ms, cpu ms, wait4 maxrss MiB) of one invocation."""
    start = time.perf_counter()
    pid = spawn(argv, env)
    _, status, usage = os.wait4(pid, 0)
    wall_ms = (time.perf_counter() - start) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed with status {os.waitstatus_to_exitcode(status)}")
    return wall_ms, (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_maxrss / 1024.0


def peak_rss_mb(argv: list, env: dict, runs: int, tmp: Path) -> tuple[float, str]:
    if not os.access(GNU_TIME, os.X_OK):
        return max(measure_once(argv, env)[2] for _ in range(runs)), "wait4 (upper bound)"
    out = tmp / "rss"
    peak = 0.0
    for _ in range(runs):
        r = subprocess.run(
            [GNU_TIME, "-f", "%M", "-o", str(out), *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        if r.returncode != 0:
            raise SystemExit(f"{argv} failed under {GNU_TIME}")
        peak = max(peak, int(out.read_text().split()[-1]) / 1024.0)
    return peak, "GNU time"


def measure(argv: list, env: dict, n: int, tmp: Path, warmup: int = 3) -> dict:
    return measure_interleaved({"one": (argv, env)}, n, tmp, warmup)["one"]


def measure_interleaved(runs: dict, n: int, tmp: Path, warmup: int = 3) -> dict:
    """``measure`` for several ``{name: (argv, env)}``, alternating them so that load hits all alike."""
    for _ in range(warmup):  # compile .pyc files, warm the page cache
        for argv, env in runs.values():
            measure_once(argv, env)
    walls = {name: [] for name in runs}
    cpus = {name: [] for name in runs}
    for _ in range(n):
        for name, (argv, env) in runs.items():
            w, c, _ = measure_once(argv, env)
            walls[name].append(w)
            cpus[name].append(c)
    return {name: _summary(walls[name], cpus[name], *peak_rss_mb(*runs[name], max(5, n // 5), tmp)) for name in runs}


def _summary(walls: list, cpus: list, rss: float, how: str) -> dict:
    walls = sorted(walls)
    return {
        "median_ms": round(statistics.median(walls), 2),
        "p95_ms": round(walls[min(len(walls) - 1, int(round(0.95 * (len(walls) - 1))))], 2),
        "min_ms": round(walls[0], 2),
        "cpu_ms": round(statistics.median(cpus), 2),
        "peak_rss_mb": round(rss, 2),
        "rss_source": how,
    }


def burst(argv: list, env: dict, k: int) -> float:
    """Seconds until k shims started at once have all finished."""
    start = time.perf_counter()
    pids = [spawn(argv, env) for _ in range(k)]
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"burst: {argv} failed")
    return round(time.perf_counter() - start, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=50, help="invocations per variant (default 50)")
    parser.add_argument("--burst", type=int, default=64, help="shims started at once in the burst test (0: skip)")
    parser.add_argument(
        "--gate",
        choices=["launcher", "module", "none"],
        default="launcher",
        help="variant whose targets decide the exit status (default: launcher)",
    )
    args = parser.parse_args()
    # As bench_e2e does: an installed mpilaunch is byte-compiled; with PYTHONDONTWRITEBYTECODE=1
    # (this VM's shells) every shim would compile each module it imports that changed since.
    compileall.compile_dir(str(REPO / "mpilaunch"), quiet=1)

    with tempfile.TemporaryDirectory(prefix="bench-shim-") as tmpdir:
        tmp = Path(tmpdir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        agent, address, secret = start_agent(tmp, env)
        plain_agent, plain_address, plain_secret = start_agent(tmp, env, tls=False)
        try:
            plain_env = dict(env)
            for where, (e, a, s) in {
                "context.json": (env, address, secret),
                "plain-context.json": (plain_env, plain_address, plain_secret),
            }.items():
                context = tmp / where
                context.write_text(
                    json.dumps(
                        {
                            "job": "bench",
                            "transport": "agent",
                            "secret_file": str(s),
                            "forward_env": ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH"],
                            "workers": {"w0": {"address": a}},
                        }
                    )
                )
                e["MPILAUNCH_CONTEXT"] = str(context)
            launcher = shim.write_launcher(str(tmp / "mpilaunch-rsh"))
            floor = tmp / "sh-agent"
            floor.write_text('#!/bin/sh\nshift; exec /bin/sh -c "$*"\n')
            floor.chmod(0o755)
            console = shutil.which("mpilaunch-rsh", path=os.path.dirname(sys.executable))
            variants = {
                "launcher": [launcher, "-x", "w0", "true"],
                "plain": [launcher, "-x", "w0", "true"],
                "module": [sys.executable, "-m", "mpilaunch.rsh_agent.shim", "-x", "w0", "true"],
                "python": [sys.executable, "-IS", "-c", "pass"],
                "baseline": [str(floor), "w0", "true"],
            }
            if console:
                variants["console"] = [console, "-x", "w0", "true"]
            results = measure_interleaved(
                {"launcher": (variants.pop("launcher"), env), "plain": (variants["plain"], plain_env)}, args.n, tmp
            )
            del variants["plain"]
            results.update({name: measure(argv, env, args.n, tmp) for name, argv in variants.items()})
            bursts = {}
            if args.burst:
                shim_argv = [launcher, "-x", "w0", "true"]
                for name, argv, e in (
                    ("launcher", shim_argv, env),
                    ("plain", shim_argv, plain_env),
                    ("baseline", variants["baseline"], env),
                ):
                    bursts[name] = burst(argv, e, args.burst)
        finally:
            for a in (agent, plain_agent):
                a.send_signal(signal.SIGTERM)
                a.wait(10)

    base = results["baseline"]["median_ms"]
    print(
        f"mpilaunch-rsh running `true` through a local agent, n={args.n} each "
        f"(targets: median <= {TARGET_MS:.0f} ms, peak RSS <= {TARGET_MB:.0f} MB)"
    )
    print(
        f"{'variant':<10} {'median ms':>10} {'p95 ms':>8} {'min ms':>8} {'cpu ms':>7} {'peak RSS MB':>12}"
        f" {'x baseline':>11}"
    )
    for name, r in results.items():
        ratio = r["median_ms"] / base if base else float("inf")
        print(
            f"{name:<10} {r['median_ms']:>10.1f} {r['p95_ms']:>8.1f} {r['min_ms']:>8.1f} {r['cpu_ms']:>7.1f} "
            f"{r['peak_rss_mb']:>12.1f} {ratio:>11.1f}"
        )
    print(
        f"(peak RSS from {next(iter(results.values()))['rss_source']}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    if bursts:
        print(
            f"burst: {args.burst} started at once, all done after "
            + ", ".join(f"{name} {sec:.2f} s" for name, sec in bursts.items())
        )
    ok = True
    if args.gate != "none":
        g = results[args.gate]
        ok = g["median_ms"] <= TARGET_MS and g["peak_rss_mb"] <= TARGET_MB
        print(f"gate ({args.gate}): {'PASS' if ok else 'FAIL'}")
    summary = {
        "bench": "shim",
        "n": args.n,
        "targets": {"median_ms": TARGET_MS, "peak_rss_mb": TARGET_MB},
        "results": results,
        "ratio_to_baseline": {k: round(v["median_ms"] / base, 2) for k, v in results.items()},
        "burst": {"k": args.burst, "seconds": bursts},
        "gate": args.gate,
        "pass": ok,
    }
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
