#!/usr/bin/env python3
"""A lost worker replaced from a spare (--spares 1) against one made anew (--retries alone), side by side.

Runs on the Kubernetes testbed's real node (containerd + kubelet; started here, or attached with
``--workdir``): a job of 2 ranks on 2 worker pods, ``--launcher local`` with the image's Open MPI
4.1 (``--launcher cluster``: the launcher pod, a new one for the relaunch), runs tests/programs/attempts.py (its first attempt sleeps). Worker 1's pod is deleted
(``kubectl delete pod --wait=false``, as an eviction does) and the time is taken from that moment
to the first rank line of the next attempt:

  retry   --retries 1: the pod is deleted, made anew under its name, scheduled, its container
          started, and mpirun relaunched;
  spare   --retries 1 --spares 1: a spare pod, Ready beside the job, takes the worker's place.

Runs alternate (retry, spare, ...); medians, the ratio and every run are printed. The target
(issue 52): spare at most 0.3x retry.
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

PROGRAM = "/opt/mpilaunch/tests/programs/attempts.py"  # where the image has it
MPIRUN = "/usr/bin/mpirun.openmpi"  # the image's Open MPI 4.1, also this machine's


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def kubectl(cluster, *args: str) -> subprocess.CompletedProcess:
    return cluster.kubectl(*args, check=False)


def pod_ready(cluster, pod: str) -> bool:
    said = kubectl(cluster, "get", "pod", pod, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
    return said.stdout.strip() == "True"


def wait_line(proc, text: str, timeout: float = 300) -> float | None:
    """Read stdout until a line contains ``text``; when it came (None: the job ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return None
        if text in line:
            return time.monotonic()
    return None


def one_run(cluster, image: str, kind: str, i: int, launcher: str = "local") -> dict:
    from testbeds.k8s.node import JOB_ARGS

    job = f"bench-sp-{launcher[0]}{kind}-{i}"
    where = ["--launcher", "local", "--mpirun", MPIRUN] if launcher == "local" else ["--launcher", "cluster"]
    out = Path(tempfile.mkdtemp(prefix="bench-sp-"))
    argv = [
        sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", image, "--name", job, *JOB_ARGS,
        *where, "--np", "2", "--slots-per-worker", "1", "-q",
        "--retries", "1", *(["--spares", "1"] if kind == "spare" else []),
        "--output-dir", str(out), "-x", "SLEEP=300", "--", "python3", PROGRAM,
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            if wait_line(proc, "started (first attempt)") is None:
                raise RuntimeError(f"{job}: the first attempt did not start: {proc.stderr.read()[-800:]}")
        if kind == "spare":  # the spare is never waited for by the job: a fair start waits for it here
            deadline = time.monotonic() + 120
            while not pod_ready(cluster, f"{job}-spare-0"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{job}: the spare pod did not turn Ready")
                time.sleep(0.1)
        la = load()
        t0 = time.monotonic()
        kubectl(cluster, "delete", "pod", f"{job}-worker-1", "--wait=false")
        relaunched = wait_line(proc, "started (relaunch)")
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0 or relaunched is None:
        raise RuntimeError(f"{job} failed (exit {proc.returncode}): {err[-800:]}")
    report = json.loads((out / "report.json").read_text())
    return {
        "kind": kind,
        "run": i,
        "lost_to_first_line_s": round(relaunched - t0, 3),
        "swaps": (report.get("spares") or {}).get("swaps", []),
        "load": la,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind (default 5)")
    ap.add_argument("--workdir", help="attach to a testbed started with `cluster up --real-node`")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--launcher", choices=("local", "cluster"), default="local", help="where mpirun runs")
    args = ap.parse_args(argv)
    from testbeds.k8s.cluster import KubeCluster

    own = None
    if args.workdir:
        cluster = KubeCluster.attach(args.workdir)
    else:
        own = cluster = KubeCluster(real_node=True).start()
    rows = []
    try:
        image = cluster.node.project_image()
        for i in range(args.runs):
            for kind in ("retry", "spare") if i % 2 == 0 else ("spare", "retry"):
                time.sleep(2.0)  # the node done tearing the last job down
                row = one_run(cluster, image, kind, i, args.launcher)
                rows.append(row)
                print(f"# {kind} run {i}: {row['lost_to_first_line_s']:.2f} s (load {row['load']})", file=sys.stderr)
    finally:
        if own is not None:
            own.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    med = {k: statistics.median(r["lost_to_first_line_s"] for r in rows if r["kind"] == k) for k in ("retry", "spare")}
    print(f"--launcher {args.launcher}")
    print("| from a deleted worker pod to the next attempt's first rank line | median | runs |")
    print("| --- | --- | --- |")
    for kind, label in (("retry", "`--retries 1` (a new pod)"), ("spare", "`--retries 1 --spares 1` (a spare pod)")):
        runs = ", ".join(f"{r['lost_to_first_line_s']:.2f}" for r in rows if r["kind"] == kind)
        print(f"| {label} | {med[kind]:.2f} s | {runs} |")
    print(f"\nspare / retry: {med['spare'] / med['retry']:.2f}x (target at most 0.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
