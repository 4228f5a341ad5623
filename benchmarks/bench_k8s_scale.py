#!/usr/bin/env python3
"""Kubernetes at scale: long-running API requests per job, and full launches over N kwok pods.

For each transport (``--transport exec``: one exec stream per mpirun daemon
through kube-apiserver; ``--transport agent``: mpilaunch's agent is each
pod's main process, reached over the pod network) and each pod count:

* **streams**: a job ``--np N --slots-per-worker 1 -- sleep HOLD`` runs while
  kube-apiserver's ``apiserver_longrunning_requests`` gauge is sampled; the
  job's share is the peak minus the idle value before it (exec streams,
  followed logs and watches alike). The target (issue 26): at most 2 for the
  agent transport, whatever N.
* **launch**: the median wall time of ``mpilaunch --backend k8s --launcher
  local --np N --slots-per-worker 1 -- true`` (pods created, Ready, mpirun
  over all of them, every rank's exit, pods deleted), ``--repeat`` runs,
  transports interleaved. A run that fails or passes ``--launch-timeout`` is
  recorded as a stall, never dropped.

The testbed: kube-apiserver, etcd, scheduler, controller-manager and kwok
nodes (``testbeds/k8s``); for the agent transport its pod runner runs each
pod's agent on this machine (``testbeds/k8s/pod_runner.py``); for the exec
transport kwok's Exec CRD runs the exec'd daemons here. So both transports do
the same work on this machine except how the daemons are reached.

    python benchmarks/bench_k8s_scale.py --pods 16,64 --repeat 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


COMPONENTS = ("kube-apiserver", "etcd", "kwok", "kubelet", "containerd")


def control_plane_cpu() -> dict[str, float]:
    """CPU seconds (user + sys, reaped children included: runc, exec'd processes) of the cluster's
    processes by component; psutil reads /proc."""
    import psutil

    out: dict[str, float] = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        name, times = p.info["name"] or "", p.info["cpu_times"]
        if times is None:
            continue
        for component in COMPONENTS:
            if name.startswith(component):
                out[component] = (
                    out.get(component, 0.0) + times.user + times.system + times.children_user + times.children_system
                )
    return out


class Sampler(threading.Thread):
    """The peak of the gauge's sum while a job runs."""

    def __init__(self, cluster, interval: float = 0.3):
        super().__init__(daemon=True)
        self.cluster, self.interval = cluster, interval
        self.peak, self.peak_detail = 0, {}
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                counts = self.cluster.longrunning_requests()
            except Exception:
                counts = {}
            total = sum(counts.values())
            if total > self.peak:
                self.peak, self.peak_detail = total, counts
            self.done.wait(self.interval)


def job_argv(job: str, transport: str, pods: int, program: list[str], real: list[str] | None = None) -> list[str]:
    """kwok: ``--launcher local``; ``real``: the real node's image and job arguments, the cluster launcher."""
    where = real if real is not None else ["--image", "mpilaunch:test", "--launcher", "local"]
    return [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "k8s",
        *where,
        "--transport",
        transport,
        "--name",
        job,
        "--np",
        str(pods),
        "--slots-per-worker",
        "1",
        "-q",
        "--start-timeout",
        "240",
        "--",
        *program,
    ]


def give_exec_targets(cluster, job: str, pods: int, work: Path) -> None:
    """The exec transport on kwok: each pod's exec'd commands get a TMPDIR of their own."""
    names = [f"{job}-worker-{i}" for i in range(pods)]
    for n in names:
        (work / n).mkdir(parents=True, exist_ok=True)
    cluster.apply(
        [cluster.pod_exec(n, env={"TMPDIR": str(work / n), "POD_NAME": n, "MPILAUNCH_WORKER": n}) for n in names]
    )


def run_job(cluster, env, job, transport, pods, program, timeout, work, sample=False, real=None) -> dict:
    if transport == "exec" and real is None:
        give_exec_targets(cluster, job, pods, work / job)
    cpu_before = control_plane_cpu()
    sampler = None
    if sample:
        baseline = sum(cluster.longrunning_requests().values())
        sampler = Sampler(cluster)
        sampler.start()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            job_argv(job, transport, pods, program, real),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        code, tail = proc.returncode, proc.stderr.strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        code, tail = None, ["timed out"]
    wall = time.perf_counter() - t0
    cpu_after = control_plane_cpu()
    out = {
        "transport": transport,
        "pods": pods,
        "wall_s": round(wall, 3),
        "exit": code,
        "stall": code != 0,
        "tail": tail,
        "cluster_cpu_s": {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 2) for k in cpu_after},
    }
    if sampler is not None:
        sampler.done.set()
        sampler.join()
        out["longrunning_job"] = sampler.peak - baseline
        out["longrunning_detail"] = {k: v for k, v in sampler.peak_detail.items() if "pods" in k and v}
    if transport == "exec" and real is None:
        cluster.kubectl(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            *[f"exec/{job}-worker-{i}" for i in range(pods)],
            check=False,
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", default="16,64", help="pod counts, comma-separated")
    ap.add_argument("--transports", default="exec,agent")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hold", type=float, default=6.0, help="seconds the streams job's ranks sleep")
    ap.add_argument("--launch-timeout", type=float, default=300)
    ap.add_argument("--no-launch", action="store_true", help="streams only")
    ap.add_argument(
        "--real-pods",
        type=int,
        default=0,
        help="also the streams job on the testbed's real node with this many pods (cluster launcher)",
    )
    ap.add_argument("--workdir", help="attach to a running testbed (python -m testbeds.k8s.cluster up --workdir DIR)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.pods.split(",")]
    transports = args.transports.split(",")

    from testbeds.k8s.cluster import KubeCluster

    own = None
    if args.workdir:
        cluster = KubeCluster.attach(args.workdir)
    else:
        own = cluster = KubeCluster()
        cluster.start()
        cluster.create_nodes(max(16, (max(counts) + 63) // 64), gpus=8)
    work = Path(tempfile.mkdtemp(prefix="bench-k8s-scale-"))
    # as the tests run kwok jobs: the pods' commands run here, with this mpilaunch (k8s/tools.py)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")},
        "KUBECONFIG": str(cluster.kubeconfig),
        "MPILAUNCH_K8S_PYTHON": sys.executable,
        "MPILAUNCH_K8S_TOOLS": "image",
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    results = {"streams": [], "launch": []}
    try:
        for pods in counts:
            for transport in transports:
                r = run_job(
                    cluster,
                    env,
                    f"s{pods}-{transport}",
                    transport,
                    pods,
                    ["sleep", str(args.hold)],
                    args.launch_timeout,
                    work,
                    sample=True,
                )
                results["streams"].append(r)
                print(
                    f"streams  {transport:5} {pods:4} pods: job holds {r.get('longrunning_job')} long-running "
                    f"requests {r.get('longrunning_detail')} (exit {r['exit']}, {r['wall_s']} s); "
                    f"cluster CPU {r['cluster_cpu_s']}",
                    flush=True,
                )
        if args.real_pods:
            from testbeds.k8s.node import JOB_ARGS

            image = cluster.node.project_image()
            # real pods run their own commands: the job's pieces come in its ConfigMap, as for users
            real_env = {k: v for k, v in env.items() if k not in ("MPILAUNCH_K8S_TOOLS", "MPILAUNCH_K8S_PYTHON")}
            for transport in transports:
                r = run_job(
                    cluster,
                    real_env,
                    f"r{args.real_pods}-{transport}",
                    transport,
                    args.real_pods,
                    ["sleep", str(args.hold)],
                    args.launch_timeout,
                    work,
                    sample=True,
                    real=["--image", image, *JOB_ARGS],
                )
                r["real"] = True
                results["streams"].append(r)
                print(
                    f"streams  {transport:5} {args.real_pods:4} real pods: job holds {r.get('longrunning_job')} "
                    f"long-running requests (peak) {r.get('longrunning_detail')} (exit {r['exit']}, "
                    f"{r['wall_s']} s); cluster CPU {r['cluster_cpu_s']}",
                    flush=True,
                )
        if not args.no_launch:
            for pods in counts:
                runs = {t: [] for t in transports}
                for i in range(args.repeat):
                    for transport in transports:  # interleaved: load hits both alike
                        r = run_job(
                            cluster,
                            env,
                            f"l{pods}-{transport}-{i}",
                            transport,
                            pods,
                            ["true"],
                            args.launch_timeout,
                            work,
                        )
                        runs[transport].append(r)
                for transport, rs in runs.items():
                    ok = [r["wall_s"] for r in rs if not r["stall"]]
                    row = {
                        "transport": transport,
                        "pods": pods,
                        "runs": len(rs),
                        "stalls": len(rs) - len(ok),
                        "median_s": round(statistics.median(ok), 2) if ok else None,
                        "walls": [r["wall_s"] for r in rs],
                        "failures": [r["tail"] for r in rs if r["stall"]],
                    }
                    results["launch"].append(row)
                    print(
                        f"launch   {transport:5} {pods:4} pods: median {row['median_s']} s over {len(ok)} "
                        f"(stalls {row['stalls']}) {row['walls']}",
                        flush=True,
                    )
    finally:
        if own is not None:
            own.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    stalls = sum(r["stall"] for r in results["streams"]) + sum(r["stalls"] for r in results["launch"])
    over = [r for r in results["streams"] if r["transport"] == "agent" and (r.get("longrunning_job") or 0) > 2]
    return 1 if stalls or over else 0


if __name__ == "__main__":
    sys.exit(main())
