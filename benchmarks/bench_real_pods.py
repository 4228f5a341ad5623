"""Launch cost on real pods: mpilaunch vs a kubectl baseline doing the same work.

    python benchmarks/bench_real_pods.py [--sizes 2 8 16] [--repeat 2] [--workdir DIR]

Runs on the Kubernetes testbed's real node (containerd + kubelet; started
here, or attached with ``--workdir`` from ``cluster up --real-node``), with
the project's image. For each N (worker pods, one rank each):

* mpilaunch: ``--launcher cluster`` (launcher Job + N workers), a rank
  program that prints one line; wall time to the first rank line and to
  exit (pods deleted), plus report.json's phases (allocate = objects
  created .. all workers Ready, run = launcher start .. mpirun done, total).
* baseline: what a hand-made launcher does with kubectl: ``kubectl apply``
  N sleeping pods, ``kubectl wait --for=condition=Ready``, one ``kubectl
  exec POD -- true`` per pod (all at once), ``kubectl delete --wait``. It
  runs no MPI at all, so it is a floor for "pods up, exec'd, gone".

Prints Markdown; every run, not only a median.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROGRAM = "import os; print('first', os.environ.get('POD_NAME'), flush=True)"


def mpilaunch_run(cluster, image: str, n: int, job: str) -> dict:
    from testbeds.k8s.node import JOB_ARGS

    out = Path(tempfile.mkdtemp(prefix="bench-rp-"))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    argv = [sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", image, "--name", job, *JOB_ARGS,
            "--np", str(n), "--slots-per-worker", "1", "--output-dir", str(out), "-q",
            "--", "python3", "-c", PROGRAM]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    for line in proc.stdout:
        if first is None and "first" in line:
            first = time.monotonic() - t0
    proc.wait()
    end = time.monotonic() - t0
    report = json.loads((out / "report.json").read_text())
    if proc.returncode != 0:
        print(f"# mpilaunch N={n} failed: {proc.stderr.read()[-500:]}", file=sys.stderr)
    return {"first": first, "exit": end, "ok": proc.returncode == 0, **report["timings"]}


def kubectl_baseline(cluster, image: str, n: int, job: str) -> dict:
    from testbeds.k8s.node import REAL_KEY

    pods = [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job}-{i}", "labels": {"bench": job}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "nodeSelector": {REAL_KEY: "true"},
                 "tolerations": [{"key": REAL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                 "containers": [{"name": "w", "image": image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]}]},
    } for i in range(n)]
    t0 = time.monotonic()
    cluster.apply(pods)
    t_created = time.monotonic() - t0
    cluster.kubectl("wait", "--for=condition=Ready", "pod", "-l", f"bench={job}", "--timeout=300s", timeout=320)
    t_ready = time.monotonic() - t0
    execs = [subprocess.Popen([cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "exec", p["metadata"]["name"],
                               "--", "python3", "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for p in pods]
    ok = all(e.wait() == 0 for e in execs)
    t_exec = time.monotonic() - t0
    cluster.kubectl("delete", "pod", "-l", f"bench={job}", "--wait=true", timeout=300)
    return {"created": t_created, "ready": t_ready, "exec": t_exec, "exit": time.monotonic() - t0, "ok": ok}


def fmt(v):
    return "-" if v is None else f"{v:.1f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[2, 8, 16])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", help="attach to a testbed started with `cluster up --real-node`")
    args = ap.parse_args(argv)
    from testbeds.k8s.cluster import KubeCluster

    own = None
    if args.workdir:
        cluster = KubeCluster.attach(args.workdir)
    else:
        own = cluster = KubeCluster(real_node=True).start()
    try:
        image = cluster.node.project_image()
        rows = []
        for n in args.sizes:
            for i in range(args.repeat):
                m = mpilaunch_run(cluster, image, n, f"bench-m{n}-{i}")
                k = kubectl_baseline(cluster, image, n, f"bench-k{n}-{i}")
                rows.append((n, i, m, k))
                print(f"# N={n} run {i}: mpilaunch {m}; kubectl {k}", file=sys.stderr)
    finally:
        if own is not None:
            own.stop()
    print("| pods | run | mpilaunch: Ready (allocate) | first rank line | mpirun done (run) | exit, all deleted "
          "| kubectl: created | Ready | exec'd | exit, all deleted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, i, m, k in rows:
        print(f"| {n} | {i} | {fmt(m.get('allocate_s'))} | {fmt(m['first'])} | {fmt(m.get('run_s'))} | "
              f"{fmt(m['exit'])}{'' if m['ok'] else ' FAILED'} | {fmt(k['created'])} | {fmt(k['ready'])} | "
              f"{fmt(k['exec'])} | {fmt(k['exit'])}{'' if k['ok'] else ' FAILED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
