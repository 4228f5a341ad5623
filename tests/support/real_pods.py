"""Helpers of the tests on the Kubernetes testbed's real node (marker ``real_pods``:
``tests/e2e/k8s/test_real_pods.py``, ``test_foreign_image.py``, ``tests/e2e/test_horovod.py``).

The session's one real-node testbed is the ``real`` fixture (``tests/e2e/conftest.py``),
a ``Real``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from support.helpers import REPO, finish, mpilaunch_env, stop  # finish, stop: the tests' names
from support.k8s import KINDS


class Real:
    """What a test needs: the cluster, the image's tag, the job arguments."""

    def __init__(self, cluster, image: str):
        from testbeds.k8s.node import JOB_ARGS

        self.cluster = cluster
        self.image = image
        self.job_args = list(JOB_ARGS)
        self.kubeconfig = str(cluster.kubeconfig)

    def kubectl(self, *args, **kw):
        return self.cluster.kubectl(*args, **kw)

    def env(self, **extra) -> dict:
        return mpilaunch_env(None, KUBECONFIG=self.kubeconfig, **extra)

    def argv(self, job: str, *args, image: str | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--image",
            image or self.image,
            "--name",
            job,
            *self.job_args,
            *args,
        ]

    def run(self, job: str, *args, timeout: float = 300, image: str | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(job, *args, image=image),
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )

    def start(self, job: str, *args, image: str | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(job, *args, image=image),
            cwd=REPO,
            env=self.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def manage(self, action: str, job: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
        """``mpilaunch status|logs|delete|wait JOB`` in the testbed's default namespace."""
        return subprocess.run(
            [sys.executable, "-m", "mpilaunch", action, job, "--backend", "k8s", *args],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @contextlib.contextmanager
    def api_outage(self, how: str):
        """The API server out for the block's duration, for everyone (this machine and the pods):
        ``unresponsive``: stopped (SIGSTOP), requests hang; ``refusing``: every packet to its port
        is rejected with a TCP reset (the pods' DNAT to it goes through the same input hook; their
        resets get lost on the way back, so their requests time out).

        ``refusing`` rejects in a table of its own at a priority before iptables' filter table:
        a rule at the top of the filter table's INPUT did not hold, because the NetworkPolicy
        enforcer (kube-router) puts its own jump back at position 1 when it syncs, and that
        chain accepts the pods' traffic to the API server. Seen: the reaper read the Lease
        throughout a "25 s outage" while this machine's renewals were refused, and deleted
        the live job (1 run in 4 under load)."""
        if how == "unresponsive":
            pid = int(self.cluster.pids["kube-apiserver"])
            os.kill(pid, signal.SIGSTOP)
            try:
                yield
            finally:
                os.kill(pid, signal.SIGCONT)
            return
        assert how == "refusing", how
        port = self.cluster.ports["kube-apiserver"]
        table = f"mpilaunch_outage_{os.getpid()}"
        rules = (
            f"table inet {table} {{\n"
            "  chain input {\n"
            "    type filter hook input priority filter - 10; policy accept;\n"
            f"    tcp dport {port} reject with tcp reset\n"
            "  }\n"
            "}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
        try:
            yield
        finally:
            subprocess.run(["nft", "delete", "table", "inet", table], check=True)

    def leftovers(self, job: str, timeout: float = 60.0) -> list[str]:
        """Objects of the job still in the API after ``timeout`` (pods of a real
        kubelet take their grace period; garbage collection is asynchronous)."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.kubectl("get", KINDS, "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
            out += self.kubectl("get", "configmap", job, "-o", "name", "--ignore-not-found").stdout.split()
            if not out:
                return out
            if time.monotonic() > deadline:
                self.describe_leftovers(job)
                return out
            time.sleep(0.5)

    def describe_leftovers(self, job: str) -> None:
        """What a failed ``leftovers`` assertion needs to tell why (pytest shows it with the
        failure): were the pods deleted at all (a deletion time), whose are they, what do they
        wait on; a leftover seen once at a run from nothing's load had no such record."""
        columns = (
            "custom-columns=NAME:.metadata.name,PHASE:.status.phase,DELETING:.metadata.deletionTimestamp,"
            "FINALIZERS:.metadata.finalizers,OWNERS:.metadata.ownerReferences[*].kind,NODE:.spec.nodeName"
        )
        print(self.kubectl("get", "pods", "-l", f"mpilaunch/job={job}", "-o", columns).stdout)
        print(self.kubectl("get", "events", "--sort-by=.lastTimestamp").stdout[-4000:])

    def containers_left(self, job: str) -> list[str]:
        """Containers of the job containerd still has (the kubelet's teardown is real too)."""
        return self.cluster.node.containers_of(f"{job}-")


def ranks_from(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        if text.startswith("{") and '"rank"' in text:
            out.append(json.loads(text))
    return sorted(out, key=lambda r: r["rank"])


def run_seeing_pods(proc: subprocess.Popen, pods, timeout: float = 300) -> tuple[int, str, str, dict]:
    """Wait for a job's mpilaunch, noting every pod ``pods()`` lists with an IP while it runs (a
    pod is gone once the job ends); its exit code, stdout, stderr and those pods by name."""
    seen: dict = {}
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update({n: p for n, p in pods().items() if p["status"].get("podIP")})
            time.sleep(0.5)
        out, err = finish(proc, 30)
    finally:
        if proc.poll() is None:
            stop(proc)
    return proc.returncode, out, err, seen


def pods_of(real: Real, job: str) -> dict[str, dict]:
    """The job's launcher and worker (or task) pods; not its orphan reaper's,
    which may run anywhere and come and go on its own schedule."""
    items = real.cluster.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role!=reaper")["items"]
    return {p["metadata"]["name"]: p for p in items}


def assert_placement(real: Real, job: str, ranks: list[dict], n: int, per_worker: int, pods: dict) -> None:
    """Every rank ran in its planned pod (map-by slot: rank r on worker r // per_worker),
    saw that pod's name, hostname and IP, and the allreduce summed over all ranks."""
    assert [r["rank"] for r in ranks] == list(range(n)), ranks
    for r in ranks:
        planned = f"{job}-worker-{r['rank'] // per_worker}"
        assert r["pod"] == planned and r["worker"] == planned and r["hostname"] == planned, r
        assert r["ip"] == pods[planned]["status"]["podIP"], (r, pods[planned]["status"].get("podIP"))
        assert r["sum"] == n * (n + 1) // 2 and r["size"] == n
    ips = {pods[p]["status"]["podIP"] for p in pods if "-worker-" in p}
    assert len(ips) == n // per_worker, "each worker pod has its own IP"


def fake_smi_template(configmap: str) -> str:
    """A --pod-template that mounts the stand-in ``nvidia-smi`` of ConfigMap ``configmap`` on the
    worker image's PATH (no GPU exists here: the one thing the preflight tests on real pods fake)."""
    return f"""\
kind: Pod
metadata:
  labels: {{mpilaunch/role: worker}}
spec:
  containers:
  - name: worker
    volumeMounts:
    - {{name: fake-smi, mountPath: /usr/local/bin/nvidia-smi, subPath: nvidia-smi}}
  volumes:
  - name: fake-smi
    configMap: {{name: {configmap}, defaultMode: 0755}}
"""
