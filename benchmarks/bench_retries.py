#!/usr/bin/env python3
"""Recover in place (--retries) vs a full teardown and resubmit, side by side.

A job of 4 ranks on 4 workers runs tests/programs/attempts.py (it sleeps on
its first attempt). Worker 1 is lost (local and YARN: its agent SIGKILLed,
which ends its YARN container; k8s: its kwok pod deleted). Measured from that moment to the first rank output of
the job's next run:

  retry     the same mpilaunch with --retries 1 replaces worker 1 only and
            relaunches mpirun on the same allocation;
  resubmit  mpilaunch without --retries fails (exit 5, deleting everything)
            and a new mpilaunch is started at once for the same job.

Runs alternate (retry, resubmit, ...); medians and every run are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # tests/support: the test helpers it reuses

WORKERS = 4


def job_argv(name: str, marker: Path, backend_args: list[str], retries: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mpilaunch",
        "--name",
        name,
        "--np",
        str(WORKERS),
        "--slots-per-worker",
        "1",
        "-q",
        "-x",
        f"ATTEMPT_MARKER={marker}",
        *backend_args,
        *(["--retries", "1"] if retries else []),
        "--",
        sys.executable,
        str(REPO / "tests/programs/attempts.py"),
    ]


def wait_lines(proc, text: str, count: int, timeout: float = 300) -> float:
    """Read stdout until ``count`` lines contain ``text``; the time the first of them arrived."""
    seen, first = 0, None
    deadline = time.monotonic() + timeout
    while seen < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"job ended early ({proc.wait()}): {proc.stderr.read()[-2000:]}")
        if text in line:
            seen += 1
            first = first or time.monotonic()
    if seen < count:
        raise SystemExit(f"timed out waiting for {count} x {text!r}")
    return first


def lose_worker(backend: str, kube, name: str) -> None:
    worker = f"{name}-worker-1"
    if backend in ("local", "yarn"):
        from support.helpers import agent_pid

        os.kill(agent_pid(worker), signal.SIGKILL)
    else:
        kube.kubectl("delete", "pod", worker, "--wait=false")


def one_run(kind: str, i: int, backend: str, kube, env: dict, work: Path, backend_args) -> float:
    name = f"bench-{kind}-{i}"
    marker = work / f"{name}.marker"
    if kube is not None:
        from support.k8s import give_pods_their_env

        give_pods_their_env(kube, name, WORKERS, work / "pods")
    proc = subprocess.Popen(
        job_argv(name, marker, backend_args, kind == "retry"),
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_lines(proc, "started (first attempt)", WORKERS)
    t_lost = time.monotonic()
    lose_worker(backend, kube, name)
    if kind == "retry":
        t_next = wait_lines(proc, "started (relaunch)", 1)
        proc.wait(timeout=300)
    else:
        code = proc.wait(timeout=300)
        if code != 5:
            raise SystemExit(f"the failed job exited {code}, not 5: {proc.stderr.read()[-2000:]}")
        again = subprocess.Popen(
            job_argv(name, marker, backend_args, False),
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        t_next = wait_lines(again, "started (relaunch)", 1)
        again.wait(timeout=300)
        proc = again
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run {i} ended with {proc.returncode}: {proc.stderr.read()[-2000:]}")
    if kube is not None:
        from support.k8s import forget_pod_env

        forget_pod_env(kube, name, WORKERS)
    return t_next - t_lost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["local", "k8s", "yarn"], default="local")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--launcher",
        choices=["local", "cluster"],
        default="local",
        help="yarn: where mpirun runs (cluster: a launcher container, a new one per attempt)",
    )
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    kube, yarn, backend_args = None, None, []
    if args.backend == "k8s":
        from testbeds.k8s.cluster import KubeCluster

        kube = KubeCluster()
        kube.start()
        kube.create_nodes(WORKERS, gpus=8)
        env.update(KUBECONFIG=str(kube.kubeconfig), MPILAUNCH_K8S_PYTHON=sys.executable)
        backend_args = ["--backend", "k8s", "--image", "mpilaunch:bench", "--launcher", "local"]
    if args.backend == "yarn":
        from testbeds.yarn.cluster import YarnCluster

        yarn = YarnCluster(num_nodemanagers=3).start()
        env.update(yarn.env)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + yarn.env["PATH"]
        backend_args = ["--backend", "yarn", "--launcher", args.launcher, "--memory", "256 MiB"]
    times = {"retry": [], "resubmit": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for kind in ("retry", "resubmit"):
                    times[kind].append(one_run(kind, i, args.backend, kube, env, Path(tmp), backend_args))
    finally:
        if kube is not None:
            kube.stop()
        if yarn is not None:
            yarn.stop(graceful=False)
    result = {
        "benchmark": "retries",
        "backend": args.backend,
        "launcher": args.launcher,
        "workers": WORKERS,
        "runs": args.runs,
        "load_avg": os.getloadavg()[0],
        **{f"{k}_median_s": round(statistics.median(v), 3) for k, v in times.items()},
        **{f"{k}_s": [round(x, 3) for x in v] for k, v in times.items()},
    }
    result["ratio"] = round(result["retry_median_s"] / result["resubmit_median_s"], 2)
    print(f"lost worker -> first rank output of the next run ({args.backend}, {WORKERS} workers, {args.runs} runs)")
    for kind in times:
        print(f"  {kind:9s} median {result[kind + '_median_s']:.3f}s  runs {result[kind + '_s']}")
    print(f"  retry / resubmit: {result['ratio']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
