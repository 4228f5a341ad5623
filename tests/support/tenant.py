"""A tenant of a locked-down shared cluster, on the real-node testbed (``tenant`` fixture).

What a shared cluster's namespace looks like to its users, and what the tests
of ``tests/e2e/k8s/test_tenant.py`` run in:

* a namespace that enforces PodSecurity ``restricted`` (latest);
* a user bound only to the built-in ``edit`` ClusterRole there (a client
  certificate of its own: no cluster-admin anywhere);
* NetworkPolicies that deny all ingress and egress by default;
* a ResourceQuota on requests and limits (so every container must have
  limits) and a LimitRange with a minimum CPU of 50m and a limit/request
  ratio of at most 2 (with defaults, as admins set them);
* the admin's one-time setup, ``mpilaunch rbac --namespace NS | kubectl apply -f -``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from support.helpers import REPO, mpilaunch_env
from support.real_pods import run_seeing_pods

ACCOUNT = "mpilaunch"
PLACEMENT = ["--np", "4", "--slots-per-worker", "2"]  # 4 ranks on 2 worker pods


def restricted_namespace(name: str) -> dict:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def edit_binding(namespace: str, user: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-edit", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def default_deny(namespace: str) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny", "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def quota(namespace: str, cpu: str = "8", memory: str = "16Gi") -> dict:
    hard = {"requests.cpu": cpu, "requests.memory": memory, "limits.cpu": cpu, "limits.memory": memory}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "compute", "namespace": namespace},
        "spec": {"hard": hard},
    }


def limit_range(namespace: str) -> dict:
    container = {
        "type": "Container",
        "min": {"cpu": "50m"},
        "maxLimitRequestRatio": {"cpu": "2"},
        "default": {"cpu": "200m", "memory": "256Mi"},
        "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
    }
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "bounds", "namespace": namespace},
        "spec": {"limits": [container]},
    }


class Tenant:
    """The namespace, the user's kubeconfig, and how to run mpilaunch as that user."""

    def __init__(self, real, workdir: Path):
        self.real = real
        self.namespace = f"tenant-{uuid.uuid4().hex[:6]}"
        self.user = "tenant-alice"
        self.kubeconfig = str(real.cluster.client_kubeconfig(workdir / "tenant.kubeconfig", self.user))

    def setup(self) -> "Tenant":
        ns = self.namespace
        self.real.cluster.apply([restricted_namespace(ns)])
        self.real.cluster.apply([edit_binding(ns, self.user), default_deny(ns), quota(ns), limit_range(ns)])
        rbac = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "rbac", "--namespace", ns],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.real.kubectl("apply", "-f", "-", input=rbac)  # the admin's one-time step, as docs/shared-clusters.md says
        return self

    def teardown(self) -> None:
        self.real.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)

    def env(self, **extra) -> dict:
        return mpilaunch_env(None, KUBECONFIG=self.kubeconfig, **extra)

    def argv(self, job: str, *args, image: str | None = None, account: bool = True) -> list[str]:
        identity = ["--service-account", ACCOUNT] if account else []
        return [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--namespace",
            self.namespace,
            "--image",
            image or self.real.image,
            "--name",
            job,
            *self.real.job_args,
            *identity,
            *args,
        ]

    def run(
        self, job: str, *args, timeout: float = 300, image: str | None = None, account: bool = True, **kw
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(job, *args, image=image, account=account),
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
        """``mpilaunch status|logs|delete|wait JOB`` as the tenant."""
        return subprocess.run(
            [sys.executable, "-m", "mpilaunch", action, job, "--backend", "k8s", "--namespace", self.namespace, *args],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def kubectl(self, *args, **kw):
        """As the admin, in the tenant's namespace."""
        return self.real.kubectl("-n", self.namespace, *args, **kw)

    def as_tenant(self, *args, check: bool = False) -> subprocess.CompletedProcess:
        """kubectl as the tenant user."""
        cmd = [
            self.real.cluster.kubectl_bin or "kubectl",
            f"--kubeconfig={self.kubeconfig}",
            "-n",
            self.namespace,
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=check)

    def objects_of(
        self, job: str, kinds: str = "all,roles,rolebindings,serviceaccounts,networkpolicies,configmaps,secrets,leases"
    ) -> list[str]:
        out = self.kubectl("get", kinds, "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
        out += self.kubectl("get", "configmap", job, "-o", "name", "--ignore-not-found").stdout.split()
        return out

    def leftovers(self, job: str, timeout: float = 60.0) -> list[str]:
        import time

        deadline = time.monotonic() + timeout
        while True:
            out = self.objects_of(job, "pods,jobs,services,networkpolicies,secrets,leases")
            if not out or time.monotonic() > deadline:
                return out
            time.sleep(0.5)

    def pod_json(self, name: str) -> dict:
        return json.loads(self.kubectl("get", "pod", name, "-o", "json").stdout)


def tenant_pods(tenant, job: str) -> dict[str, dict]:
    items = json.loads(
        tenant.kubectl("get", "pods", "-l", f"mpilaunch/job={job},mpilaunch/role!=reaper", "-o", "json").stdout
    )["items"]
    return {p["metadata"]["name"]: p for p in items}


def run_watching(tenant, job: str, *args, image: str | None = None, timeout: float = 300):
    """Run the job as the tenant: exit code, stdout, stderr, and the pods seen with IPs."""
    return run_seeing_pods(tenant.start(job, *args, image=image), lambda: tenant_pods(tenant, job), timeout)
