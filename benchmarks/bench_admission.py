#!/usr/bin/env python3
"""What a gang scheduler and a queue add to a job's start: a 16-pod job under the default
scheduler, Volcano (--gang volcano) and Kueue (--queue), side by side in one run.

The testbed (testbeds/k8s): kube-apiserver, etcd, kube-scheduler, 16 kwok nodes
of 8 GPUs, Volcano v1.10 (vc-scheduler with a 1 s schedule period, the
testbed's setting, and vc-controller-manager) and Kueue v0.17 (controller and
webhooks). Each run is ``mpilaunch --backend k8s --launcher local --transport
exec --np 16 --slots-per-worker 1 --gpus-per-node 8 -- true`` with
``--output-dir``; from report.json's phases (seconds since mpilaunch started):

* ``bound``: from the last of the 16 worker pods created to the last one
  bound to a node, as a watcher polling the pods every 20 ms sees them (the
  gang's wait for all its members, Kueue's admission and gate removal, the
  scheduling itself): what a gang scheduler and a queue add;
* ``ready``: from ``allocated`` to every worker Ready, report.json's phases
  (mpilaunch polls every 0.5 s: coarse);
* ``wall``: the whole run, pods deleted included.

Modes are interleaved, ``--repeat`` runs each; medians are reported.

    python benchmarks/bench_admission.py --repeat 5 [--json out.json]
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

MODES = {"default": [], "volcano": ["--gang", "volcano"], "kueue": ["--queue", "bench-lq"]}
PODS = 16


class PodWatch(threading.Thread):
    """Polls the job's worker pods every 20 ms: when the last was created, when the last was bound."""

    def __init__(self, core, job: str):
        super().__init__(daemon=True)
        self.core, self.job = core, job
        self.all_created = self.all_bound = None
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            pods = self.core.list_namespaced_pod(
                "default", label_selector=f"mpilaunch/job={self.job},mpilaunch/role=worker"
            ).items
            now = time.perf_counter()
            if self.all_created is None and len(pods) == PODS:
                self.all_created = now
            if self.all_created is not None and all(p.spec.node_name for p in pods):
                self.all_bound = now
                return


def run(cluster, core, env, job: str, mode: str, work: Path, timeout: float) -> dict:
    names = [f"{job}-worker-{i}" for i in range(PODS)]
    for n in names:  # kwok's exec: each pod's commands get a TMPDIR of their own
        (work / n).mkdir(parents=True, exist_ok=True)
    cluster.apply(
        [cluster.pod_exec(n, env={"TMPDIR": str(work / n), "POD_NAME": n, "MPILAUNCH_WORKER": n}) for n in names]
    )
    out_dir = work / f"{job}-out"
    argv = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "k8s",
        "--image",
        "mpilaunch:test",
        "--launcher",
        "local",
        "--transport",
        "exec",
        "--name",
        job,
        "--np",
        str(PODS),
        "--slots-per-worker",
        "1",
        "-q",
        "--output-dir",
        str(out_dir),
        *MODES[mode],
        "--",
        "true",
    ]
    watch = PodWatch(core, job)
    watch.start()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    watch.done.set()
    watch.join()
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *[f"exec/{n}" for n in names], check=False)
    if proc.returncode != 0:
        return {"mode": mode, "exit": proc.returncode, "tail": proc.stderr.strip().splitlines()[-3:]}
    phases = json.loads((out_dir / "report.json").read_text())["timings"]["phases"]
    bound = None if watch.all_bound is None else round(watch.all_bound - watch.all_created, 3)
    return {
        "mode": mode,
        "exit": 0 if bound is not None else "not seen bound",
        "wall_s": round(wall, 3),
        "bound_s": bound,
        "ready_s": round(phases["workers_ready"] - phases["allocated"], 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from testbeds.k8s.cluster import KubeCluster
    from testbeds.k8s.kueue import Kueue
    from testbeds.k8s.volcano import Volcano

    cluster = KubeCluster()
    work = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    results = []
    try:
        cluster.start()
        cluster.create_nodes(16, gpus=8)
        Volcano(cluster).start()
        kueue = Kueue(cluster).start()
        kueue.make_queue("bench-cq", "bench-lq", gpus=128, cpu=1000, memory="4Ti")
        from kubernetes import client, config

        config.load_kube_config(str(cluster.kubeconfig))
        core = client.CoreV1Api()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")},
            "KUBECONFIG": str(cluster.kubeconfig),
            "MPILAUNCH_K8S_PYTHON": sys.executable,
            "MPILAUNCH_K8S_TOOLS": "image",
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        }
        for i in range(args.repeat):
            for mode in MODES:  # interleaved: load hits each mode alike
                r = run(cluster, core, env, f"adm-{mode}-{i}", mode, work, args.timeout)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        cluster.stop()
    summary = {}
    for mode in MODES:
        ok = [r for r in results if r["mode"] == mode and r["exit"] == 0]
        summary[mode] = {
            "runs": len(ok),
            "failed": sum(r["mode"] == mode and r["exit"] != 0 for r in results),
            **{
                f"median_{k}": round(statistics.median(r[k] for r in ok), 2) if ok else None
                for k in ("bound_s", "ready_s", "wall_s")
            },
        }
    base = summary["default"]
    for mode, row in summary.items():
        added = {
            k: round(row[f"median_{k}"] - base[f"median_{k}"], 2)
            for k in ("bound_s", "ready_s", "wall_s")
            if row[f"median_{k}"] is not None
        }
        print(
            f"{mode:8} {row['runs']} runs: bound {row['median_bound_s']} s, ready {row['median_ready_s']} s, "
            f"wall {row['median_wall_s']} s; vs default {added}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "summary": summary}, indent=1) + "\n")
    return 1 if any(r["exit"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
