"""Helpers of the Kubernetes tests on the kwok testbed (``tests/e2e/k8s``, and the
cross-backend tests in ``tests/e2e`` that also run on it).

kwok gives exec'd commands no pod-specific environment, so each test gives each
worker pod its own (``give_pods_their_env``), and plays the kubelet where a pod's
own command must run (``end_launcher_pod``, ``run_reaper_pod``).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.helpers import REPO, wait_for

KINDS = "configmaps,serviceaccounts,roles,rolebindings,services,pods,jobs,secrets,leases,networkpolicies"


def give_pods_their_env(kube, job: str, workers: int, root: Path) -> None:
    """What a real pod has and kwok's exec lacks: its own name, tmp and shm dirs."""
    for i in range(workers):
        pod = f"{job}-worker-{i}"
        d = root / pod
        d.mkdir(parents=True, exist_ok=True)
        kube.set_pod_exec(
            pod,
            workdir=str(REPO),
            env={
                "POD_NAME": pod,
                "MPILAUNCH_WORKER": pod,
                "TMPDIR": str(d),
                "OMPI_MCA_btl_vader_backing_directory": str(d),
                "OMPI_MCA_btl_sm_backing_directory": str(d),
            },
        )


def forget_pod_env(kube, job: str, workers: int) -> None:
    names = [f"exec/{job}-worker-{i}" for i in range(workers)]
    kube.kubectl("delete", "--ignore-not-found", "--wait=false", *names, check=False)


def leftover_objects(kube, job: str, timeout: float = 20.0) -> list[str]:
    """Objects of the job still in the API after ``timeout`` (garbage collection is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        out = kube.kubectl("get", KINDS, "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
        out += [n for n in kube.kubectl("get", "configmap", job, "-o", "name", "--ignore-not-found").stdout.split()]
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def start(args, env, **kw):
    """``mpilaunch --backend k8s`` with ``args``, started (stdout and stderr piped, text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", "mpilaunch:test", *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def stop(proc) -> None:
    """End a job's CLI the way a user would (it then deletes what it made); SIGKILL only as a last resort."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def end_launcher_pod(kube, pod: dict, code: int) -> None:
    """Play the kubelet: the launcher container ended with ``code`` (kwok runs no container)."""
    patch = {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "launcher",
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}},
                }
            ],
        }
    }
    kube.kubectl(
        "patch", "pod", pod["metadata"]["name"], "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def manage_k8s(env, *args, timeout=60):
    """``mpilaunch ACTION ... --backend k8s`` (status, logs, wait, delete), run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args, "--backend", "k8s"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def access(kube, sa: str, verb: str, resource: str, name: str, subresource: str = "", group: str = "") -> bool:
    """Whether ServiceAccount ``sa`` may ``verb`` that object, as the API server's authorizer decides."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:default:{sa}",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"],
            "resourceAttributes": {
                "namespace": "default",
                "verb": verb,
                "resource": resource,
                "group": group,
                "subresource": subresource,
                "name": name,
            },
        },
    }
    out = kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    return json.loads(out.stdout)["status"].get("allowed", False)


def in_cluster_env(kube, k8s_env, sa: str, sa_dir: Path) -> dict:
    """A pod's in-cluster environment for ServiceAccount ``sa``: its TokenRequest token, the CA, the API address."""
    sa_dir.mkdir(parents=True, exist_ok=True)
    token = kube.kubectl("create", "token", sa, "--duration=10m").stdout.strip()
    (sa_dir / "token").write_text(token)
    (sa_dir / "ca.crt").write_bytes(Path(kube.pki.ca_crt).read_bytes())
    (sa_dir / "namespace").write_text("default")
    host, port = kube.server.rsplit("//", 1)[1].rsplit(":", 1)
    env = {k: v for k, v in k8s_env.items() if k != "KUBECONFIG"}
    env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port, MPILAUNCH_K8S_SA_DIR=str(sa_dir))
    return env


def run_reaper_pod(kube, k8s_env, job: str, tmp_path: Path) -> subprocess.Popen:
    """Play the kubelet for the reaper pod: run its own command, with its own ServiceAccount's token."""

    def reaper_pod():
        pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=reaper")["items"]
        return pods[0] if pods else None

    pod = wait_for(reaper_pod, 60, "the reaper pod")
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["serviceAccountName"] == f"{job}-reaper"
    command = container["command"]
    assert command[:3] == ["python3", "-m", "mpilaunch.backends.k8s.in_cluster.reaper"]
    env = in_cluster_env(kube, k8s_env, f"{job}-reaper", tmp_path / "reaper-sa")
    return subprocess.Popen(
        [sys.executable, *command[1:]], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def end_processes(*procs) -> None:
    """A failed test's own processes (their children may hold the pipes: no waiting for EOF)."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
        if p is not None:
            try:
                p.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def launcher_files(kube, job: str, tmp_path: Path) -> Path:
    """Play the kubelet's volumes for the launcher pod: the root ConfigMap's launch.json and the job
    Secret's, the latter where the former's ``cluster.secret_file`` says (rewritten to a path here);
    with the agent transport also the agent Secret's (``cluster.agent_secret_file``)."""
    launch = json.loads(kube.get_json("configmap", job)["data"]["launch.json"])
    secret = kube.get_json("secret", f"{job}-env")
    secret_file = tmp_path / "launcher-secret" / "launch.json"
    secret_file.parent.mkdir(parents=True, exist_ok=True)
    secret_file.write_bytes(base64.b64decode(secret["data"]["launch.json"]))
    assert launch["cluster"]["secret_file"] == "/etc/mpilaunch-secret/launch.json"
    launch["cluster"]["secret_file"] = str(secret_file)
    if launch["cluster"]["transport"] == "agent":  # the workers' agents' secret, for the shims
        agent_secret = kube.get_json("secret", f"{job}-agent")
        assert launch["cluster"]["agent_secret_file"] == "/etc/mpilaunch-agent/secret"
        launch["cluster"]["agent_secret_file"] = str(secret_file.parent / "agent-secret")
        Path(launch["cluster"]["agent_secret_file"]).write_bytes(base64.b64decode(agent_secret["data"]["secret"]))
    (tmp_path / "launch.json").write_text(json.dumps(launch))
    return tmp_path / "launch.json"


class PeakLongRunning(threading.Thread):
    """kube-apiserver's long-running requests (exec streams, followed logs, watches) at their
    peak while a job runs, less what was open before it.

    ``mark()`` once the ranks run: from then on ``peak``/``detail`` are what the job holds while
    it runs (exec streams stay for the job's life); ``startup_peak``/``startup_detail`` keep what
    came before (a kubelet's watch of each Secret and ConfigMap it mounts lasts until it has read
    that the object is immutable).
    """

    def __init__(self, kube):
        super().__init__(daemon=True)
        self.kube, self.done = kube, threading.Event()
        self.baseline = kube.longrunning_requests()
        self.peak, self.detail = 0, {}
        self.startup_peak, self.startup_detail = 0, {}
        self.lock = threading.Lock()

    def run(self):
        while not self.done.is_set():
            now = self.kube.longrunning_requests()
            extra = sum(now.values()) - sum(self.baseline.values())
            with self.lock:
                if extra > self.peak:
                    self.peak, self.detail = (
                        extra,
                        {k: v - self.baseline.get(k, 0) for k, v in now.items() if v != self.baseline.get(k, 0)},
                    )
            self.done.wait(0.3)

    def mark(self):
        with self.lock:
            self.startup_peak, self.startup_detail = self.peak, self.detail
            self.peak, self.detail = 0, {}

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


def delete_pod_while_running(kube, proc, pod: str, timeout: float = 120) -> tuple[str, str, str, float]:
    """Delete a running job's pod (not waiting for it to go); ``(its node, the job's stdout, stderr,
    seconds from the deletion to the job's end)``. The job is killed should it outlive ``timeout``."""
    node = kube.kubectl("get", "pod", pod, "-o", "jsonpath={.spec.nodeName}").stdout.strip()
    t0 = time.monotonic()
    try:
        kube.kubectl("delete", "pod", pod, "--wait=false")
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return node, out, err, time.monotonic() - t0
