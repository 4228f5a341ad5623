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

``--backend yarn``: the same job on the YARN testbed (a real ResourceManager and 3
NodeManagers, started here) with Open MPI 5 from PyPI; worker 1 is lost by SIGKILLing its agent,
which ends its container (as a lost NodeManager's container ends), and ``retry`` waits for a new
container from the ResourceManager where ``spare`` takes the spare container already running.

Runs alternate (retry, spare, ...); medians, the ratio and every run are printed. The target
(issue 52): spare at most 0.3x retry.
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
sys.path.insert(0, str(REPO / "tests"))  # tests/support: the agents' pids (YARN)

PROGRAM = "/opt/mpilaunch/tests/programs/attempts.py"  # where the image has it
# --settle: seconds between the job being ready to lose a worker (both ranks started; the spare
# Ready) and the loss. 0 puts the loss the moment a spare turns Ready, a worst case for it: its
# agent's first session is then ~0.2 s slower (seen on real pods); a real job loses a worker
# minutes in, its spare long warm.
SETTLE_S = 0.0
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


def timed_loss(job: str, argv: list[str], env: dict, out: Path, kind: str, i: int, spare_waiting, lose) -> dict:
    """Run ``argv`` (job ``job``, its record in ``out``); once both ranks started and (``spare``)
    ``spare_waiting()`` holds, ``lose()`` worker 1; the time from then to the relaunch's first line."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            if wait_line(proc, "started (first attempt)") is None:
                raise RuntimeError(f"{job}: the first attempt did not start: {proc.stderr.read()[-800:]}")
        if kind == "spare":  # the spare is never waited for by the job: a fair start waits for it here
            deadline = time.monotonic() + 120
            while not spare_waiting():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{job}: the spare did not come up")
                time.sleep(0.1)
        time.sleep(SETTLE_S)  # --settle: the loss comes this far into the run, for both kinds
        la = load()
        t0 = time.monotonic()
        lose()
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
    return timed_loss(
        job,
        argv,
        env,
        out,
        kind,
        i,
        lambda: pod_ready(cluster, f"{job}-spare-0"),
        lambda: kubectl(cluster, "delete", "pod", f"{job}-worker-1", "--wait=false"),
    )


def one_yarn_run(env: dict, mpirun: str, kind: str, i: int, launcher: str = "local") -> dict:
    """One run on the YARN testbed: worker 1's agent SIGKILLed, which ends its container."""
    from support.helpers import agent_workers

    def agent_of(worker: str) -> int | None:
        return next((pid for pid, served in agent_workers().items() if served == worker), None)

    job = f"bench-sp-y{launcher[0]}{kind}-{i}"
    out = Path(tempfile.mkdtemp(prefix="bench-sp-"))
    marker = out / "marker"
    argv = [
        sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--name", job, "--mpirun", mpirun,
        "--launcher", launcher, "--memory", "256 MiB", "--np", "2", "--slots-per-worker", "1", "-q",
        "--retries", "1", *(["--spares", "1"] if kind == "spare" else []), "--output-dir", str(out),
        "-x", f"ATTEMPT_MARKER={marker}", "-x", "SLEEP=300", "--", sys.executable, str(REPO / "tests/programs/attempts.py"),
    ]  # fmt: skip
    return timed_loss(
        job,
        argv,
        env,
        out,
        kind,
        i,
        lambda: agent_of(f"{job}-spare-0") is not None,
        lambda: os.kill(agent_of(f"{job}-worker-1"), signal.SIGKILL),
    )


def interleaved(runs: int):
    """(kind, run) in the order they run: retry first in even runs, spare first in odd ones."""
    for i in range(runs):
        for kind in ("retry", "spare") if i % 2 == 0 else ("spare", "retry"):
            yield kind, i


def k8s_runs(runs: int, launcher: str, workdir: str | None):
    from testbeds.k8s.cluster import KubeCluster

    own = None
    cluster = KubeCluster.attach(workdir) if workdir else None
    if cluster is None:
        own = cluster = KubeCluster(real_node=True).start()
    try:
        image = cluster.node.project_image()
        for kind, i in interleaved(runs):
            yield kind, i, lambda kind, i: one_run(cluster, image, kind, i, launcher)
    finally:
        if own is not None:
            own.stop()


def yarn_runs(runs: int, launcher: str):
    from support.helpers import mpilaunch_env
    from support.mpi_installs import installs
    from testbeds.yarn.cluster import YarnCluster

    ompi = installs()["openmpi5"]
    yarn = YarnCluster(num_nodemanagers=3).start()
    env = mpilaunch_env(ompi, **yarn.env) | {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), yarn.env["PATH"]])
    }
    try:
        for kind, i in interleaved(runs):
            yield kind, i, lambda kind, i: one_yarn_run(env, ompi.mpirun, kind, i, launcher)
    finally:
        yarn.stop(graceful=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind (default 5)")
    ap.add_argument("--workdir", help="attach to a testbed started with `cluster up --real-node`")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--launcher", choices=("local", "cluster"), default="local", help="where mpirun runs")
    ap.add_argument("--backend", choices=("k8s", "yarn"), default="k8s", help="the real node's pods, or YARN")
    ap.add_argument(
        "--settle", type=float, default=0.0, help="seconds into the ready job before the loss, both kinds (default 0)"
    )
    args = ap.parse_args(argv)
    global SETTLE_S
    SETTLE_S = args.settle
    rows = []
    if args.backend == "yarn":
        runs = yarn_runs(args.runs, args.launcher)
    else:
        runs = k8s_runs(args.runs, args.launcher, args.workdir)
    for kind, i, run in runs:
        time.sleep(2.0)  # the last job's containers or pods done going
        row = run(kind, i)
        rows.append(row)
        print(f"# {kind} run {i}: {row['lost_to_first_line_s']:.2f} s (load {row['load']})", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    med = {k: statistics.median(r["lost_to_first_line_s"] for r in rows if r["kind"] == k) for k in ("retry", "spare")}
    print(f"--backend {args.backend} --launcher {args.launcher} --settle {args.settle:g}")
    print("| from a lost worker to the next attempt's first rank line | median | runs |")
    print("| --- | --- | --- |")
    for kind, label in (("retry", "`--retries 1` (a new one)"), ("spare", "`--retries 1 --spares 1` (a spare)")):
        runs = ", ".join(f"{r['lost_to_first_line_s']:.2f}" for r in rows if r["kind"] == kind)
        print(f"| {label} | {med[kind]:.2f} s | {runs} |")
    print(f"\nspare / retry: {med['spare'] / med['retry']:.2f}x (target at most 0.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
