"""Talking to the testbed cluster: waits, kubectl, nodes, kwok's exec; a part of
:class:`~testbeds.k8s.cluster.KubeCluster`.

Stdlib only.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from .binaries import KWOK_NODE_KEY, KWOK_NODE_VALUE, MARKER_ENV
from .common import ClusterError


class ClusterClient:
    """What tests do with a running cluster (mixed into ``KubeCluster``)."""

    def _wait(self, pred, timeout: float, what: str, interval: float = 0.2) -> None:
        deadline = time.monotonic() + max(timeout, 1)
        while True:
            self.check_alive()
            try:
                if pred():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def _http_ok(self, url: str, tls: bool = False, client_cert=None) -> bool:
        ctx = None
        if url.startswith("https"):
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if client_cert:
                ctx.load_cert_chain(*map(str, client_cert))
        try:
            with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_apiserver_ready(self, timeout: float = 120.0) -> None:
        """Wait for GET /readyz to return 200 (admin client cert)."""
        url = f"{self.server}/readyz"
        self._wait(lambda: self._http_ok(url, client_cert=self.admin), timeout, "kube-apiserver /readyz")

    def wait_nodes_ready(self, names=None, timeout: float = 120.0, selector: str | None = "type=kwok") -> None:
        """Wait until the named nodes (default: all kwok nodes) are Ready."""

        def ready():
            nodes = self.get_json("nodes", *(["-l", selector] if selector else []))["items"]
            byname = {n["metadata"]["name"]: n for n in nodes}
            want = list(names) if names is not None else list(byname)
            for w in want:
                n = byname.get(w)
                if n is None:
                    return False
                conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
                if conds.get("Ready") != "True":
                    return False
            return True

        self._wait(ready, timeout, "nodes Ready", interval=0.5)

    def wait_crds_established(self, names, timeout: float = 60.0) -> None:
        """Wait until every named CustomResourceDefinition is Established.

        Not ``kubectl wait --for=condition=Established``: a CRD the API server has not
        yet given a status makes that kubectl fail at once ("status.conditions accessor
        error: <nil>") instead of waiting, which a loaded machine hits (CI did).
        """
        names = list(names)

        def established():
            crds = self.get_json("crd", *names)
            items = crds["items"] if "items" in crds else [crds]
            for crd in items:
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if conds.get("Established") != "True":
                    return False
            return len(items) == len(names)

        self._wait(established, timeout, f"CRDs Established ({', '.join(names)})", interval=0.5)

    def wait_pods(
        self,
        namespace: str = "default",
        selector: str | None = None,
        phase: str = "Running",
        count: int | None = None,
        timeout: float = 120.0,
    ) -> list[dict]:
        """Wait until `count` (default: all matching, at least one) pods are in `phase`."""
        result: list[dict] = []

        def ok():
            args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
            pods = self.get_json(*args)["items"]
            good = [p for p in pods if p.get("status", {}).get("phase") == phase]
            result[:] = good
            if count is None:
                return bool(pods) and len(good) == len(pods)
            return len(good) >= count

        self._wait(ok, timeout, f"pods {phase}", interval=0.5)
        return result

    # ---------------------------------------------------------- clients

    def kubectl(
        self,
        *args,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float | None = 120,
        text: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run kubectl with the admin kubeconfig; returns CompletedProcess
        (stdout/stderr captured). Raises ClusterError if check and it fails."""
        cmd = [self.kubectl_bin or "kubectl", f"--kubeconfig={self.kubeconfig}", *map(str, args)]
        p = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, timeout=timeout)
        if check and p.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
        return p

    def apply(self, manifest: str | dict | list) -> None:
        """kubectl apply a YAML/JSON string or an object (or list of objects)."""
        if not isinstance(manifest, str):
            if isinstance(manifest, list):
                manifest = {"apiVersion": "v1", "kind": "List", "items": manifest}
            manifest = json.dumps(manifest)
        self.kubectl("apply", "-f", "-", input=manifest)

    def get_json(self, *args) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this cluster."""
        e = dict(os.environ)
        e["KUBECONFIG"] = str(self.kubeconfig)
        return e

    # ---------------------------------------------------------- nodes & exec

    def create_nodes(
        self,
        n: int = 16,
        gpus: int = 8,
        cpu: str = "32",
        memory: str = "256Gi",
        prefix: str = "node",
        pods: int = 110,
        taint: bool = False,
        labels: dict[str, str] | None = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> list[str]:
        """Create `n` kwok-managed fake nodes PREFIX-0..PREFIX-(n-1) with
        `gpus` nvidia.com/gpu (capacity and allocatable), wait until Ready.

        Nodes are labelled ``type=kwok`` and annotated
        ``kwok.x-k8s.io/node=fake``; with ``taint=True`` they also carry the
        usual ``kwok.x-k8s.io/node=fake:NoSchedule`` taint. Each node gets its
        own pod CIDR 127.65.I.0/24 (I = index; n <= 256), so a pod IP tells
        the node and is a loopback address.
        """
        if n > 256:
            raise ValueError("at most 256 nodes (one loopback /24 each)")
        names = []
        items = []
        for i in range(n):
            name = f"{prefix}-{i}"
            names.append(name)
            res = {"cpu": str(cpu), "memory": str(memory), "pods": str(pods)}
            if gpus:
                res["nvidia.com/gpu"] = str(gpus)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_KEY: KWOK_NODE_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/role": "agent",
                        **(labels or {}),
                    },
                },
                "spec": {"podCIDR": f"127.65.{i}.0/24", "podCIDRs": [f"127.65.{i}.0/24"]},
                # kwok's node-initialize stage keeps these and adds conditions
                "status": {"capacity": res, "allocatable": res},
            }
            if taint:
                node["spec"]["taints"] = [{"key": KWOK_NODE_KEY, "value": KWOK_NODE_VALUE, "effect": "NoSchedule"}]
            items.append(node)
        # a Node keeps the status it is created with (as when a kubelet
        # registers), so capacity is there before kwok first sees it
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        if wait:
            self.wait_nodes_ready(names, timeout=timeout)
        return names

    def longrunning_requests(self) -> dict[str, int]:
        """kube-apiserver's ``apiserver_longrunning_requests`` gauge, summed by verb and
        subresource (``"CONNECT pods/exec"``, ``"GET pods/log"``, ``"WATCH pods"``): the
        requests it holds open now (exec streams, followed logs, watches)."""
        counts: dict[str, int] = {}
        for line in self.kubectl("get", "--raw", "/metrics").stdout.splitlines():
            if not line.startswith("apiserver_longrunning_requests{"):
                continue
            labels_text, _, value = line.rpartition("} ")
            labels = dict(item.split("=", 1) for item in labels_text.split("{", 1)[1].split(",") if "=" in item)
            labels = {k: v.strip('"') for k, v in labels.items()}
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            key = f"{labels.get('verb', '')} {resource}"
            counts[key] = counts.get(key, 0) + int(float(value))
        return counts

    def set_pod_exec(
        self,
        pod: str,
        namespace: str = "default",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        containers: list[str] | None = None,
    ) -> None:
        """Give one pod its own exec target (a namespaced kwok ``Exec``
        object named like the pod): commands exec'd into it run in `workdir`
        with `env` added. Needs enable_exec_crd=True."""
        self.apply(self.pod_exec(pod, namespace, workdir, env, containers))

    def pod_exec(
        self,
        pod: str,
        namespace: str = "default",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        containers: list[str] | None = None,
    ) -> dict:
        """The ``Exec`` object set_pod_exec applies (apply a list of them at once for many pods)."""
        envs = [{"name": MARKER_ENV, "value": self.marker}, *({"name": k, "value": v} for k, v in (env or {}).items())]
        local: dict = {"envs": envs, "workDir": str(workdir or self.exec_dir)}
        target: dict = {"local": local}
        if containers:
            target["containers"] = containers
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Exec",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"execs": [target]},
        }

    # ---------------------------------------------------------- state file

    # helpers node.py builds on
    wait = _wait
    http_ok = _http_ok
