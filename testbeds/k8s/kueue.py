"""A real Kueue (controller manager + its webhooks) on a testbed cluster.

Kueue runs as a local process next to the control plane (``cluster.spawn``,
so ``cluster.stop()`` ends it too), with the plain-Pod integration: pods
labelled ``kueue.x-k8s.io/queue-name`` (and, for a group,
``kueue.x-k8s.io/pod-group-name`` + the annotation
``kueue.x-k8s.io/pod-group-total-count``) are gated by Kueue's webhook and
admitted as one Workload.

There is no Service for the webhooks here: the admission webhooks and the
CRD conversion webhook are installed with ``clientConfig.url:
https://127.0.0.1:PORT/...`` and the cluster CA as caBundle; the serving
certificates come from the testbed's PKI (``internalCertManagement`` off).
Kueue talks to the API server with an admin (system:masters) client
certificate, instead of its RBAC roles.

The binary and manifests come from ``build-kueue.sh`` (the binary through ``build.sh kueue``, cached in
``$MPILAUNCH_CACHE/mpilaunch-k8s``). Stdlib only.

Python use::

    from testbeds.k8s.cluster import KubeCluster
    from testbeds.k8s.kueue import Kueue
    with KubeCluster() as c:
        c.create_nodes(2, gpus=8)
        k = Kueue(c).start()
        k.make_queue("cq", "lq", "default", gpus=8, cpu=64, memory="512Gi")
        ...  # pods labelled kueue.x-k8s.io/queue-name=lq
        k.stop()
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from ..ports import free_port
from .common import cache_dir

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build-kueue.sh"
KUEUE_VERSION = os.environ.get("KUEUE_VERSION", "v0.17.0")

API = "kueue.x-k8s.io/v1beta2"
#: labels / annotations of the plain-Pod integration (pkg/controller/jobs/pod/constants)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
SCHEDULING_GATE = "kueue.x-k8s.io/admission"
POD_FINALIZER = "kueue.x-k8s.io/managed"
#: "false" on any pod of a group: its failed/deleted pods need no replacement, so
#: Kueue finishes the group (and drops its pods' finalizers) once none is running
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
#: namespaces whose pods Kueue never manages (its managedJobsNamespaceSelector)
EXCLUDED_NAMESPACES = ("kube-system", "kueue-system")
GPU = "nvidia.com/gpu"


def _b64(path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def binary_path() -> Path:
    return cache_dir() / "bin" / f"kueue-{KUEUE_VERSION}"


def share_dir() -> Path:
    return cache_dir() / "share" / f"kueue-{KUEUE_VERSION}"


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) the kueue binary and its manifests; return the binary."""
    if not (os.access(binary_path(), os.X_OK) and (share_dir() / ".complete").exists()):
        if not quiet:
            print(f"[kueue] building kueue {KUEUE_VERSION} via {BUILD_SH}", file=sys.stderr)
        out = subprocess.DEVNULL if quiet else None
        subprocess.run(
            ["bash", str(BUILD_SH)], check=True, stdout=out, env={**os.environ, "KUEUE_VERSION": KUEUE_VERSION}
        )
    return binary_path()


def pod_group_metadata(
    queue: str, group: str | None = None, total: int | None = None, priority_class: str | None = None
) -> dict:
    """``metadata`` fragment (labels + annotations) that puts a plain pod in
    LocalQueue `queue`, as member of pod group `group` of `total` pods."""
    labels = {QUEUE_LABEL: queue}
    annotations = {}
    if group is not None:
        labels[GROUP_NAME_LABEL] = group
        annotations[GROUP_TOTAL_COUNT_ANNOTATION] = str(total)
    if priority_class:
        labels[PRIORITY_CLASS_LABEL] = priority_class
    return {"labels": labels, "annotations": annotations}


class Kueue:
    """Kueue's controller manager on `cluster` (a started ``KubeCluster``).

    Attributes after ``start()``: ``dir`` (config, certs, kubeconfig),
    ``webhook_port``, ``health_port``, ``visibility_port`` (the visibility
    API server, reachable only directly: there is no APIService here),
    ``kubeconfig`` (its admin kubeconfig), ``config_file``.
    """

    NAME = "kueue"

    def __init__(
        self,
        cluster,
        *,
        frameworks=("pod",),
        feature_gates: dict[str, bool] | None = None,
        wait_for_pods_ready: dict | None = None,
        extra_config: dict | None = None,
        log_level: int = 2,
        start_timeout: float = 120.0,
    ):
        self.cluster = cluster
        self.frameworks = list(frameworks)
        self.feature_gates = dict(feature_gates or {})
        self.wait_for_pods_ready = wait_for_pods_ready
        self.extra_config = dict(extra_config or {})
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.dir = Path(cluster.workdir) / "kueue"
        self.webhook_port = self.health_port = self.visibility_port = None
        self.kubeconfig = self.dir / "kueue.kubeconfig"
        self.config_file = self.dir / "config.yaml"
        self.webhook_names: list[tuple[str, str]] = []  # (kind, name) installed
        self._started = False

    # ---------------------------------------------------------- lifecycle

    def __enter__(self) -> "Kueue":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Kueue":
        if self._started:
            return self
        t0 = time.monotonic()
        binary = ensure_built()
        c = self.cluster
        self.dir.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port, self.visibility_port = free_port(), free_port(), free_port()
        self.webhook_url = f"https://127.0.0.1:{self.webhook_port}"
        self._make_certs()
        # admin rights: Kueue's own ClusterRoles are not installed here
        c.client_kubeconfig(self.kubeconfig, "kueue-controller", ("system:masters",))
        if c.kubectl("get", "namespace", "kueue-system", check=False).returncode != 0:
            c.kubectl("create", "namespace", "kueue-system")
        self._apply_crds()
        self._write_config()
        self._started = True
        try:
            c.spawn(
                self.NAME,
                [
                    binary,
                    f"--config={self.config_file}",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--visibility-server-port={self.visibility_port}",
                    f"--zap-log-level={self.log_level}",
                    "--zap-devel=false",
                ],
                env={"KUEUE_TESTBED_CERT_ROOT": str(self.dir / "root")},
            )
            deadline = time.monotonic() + self.start_timeout
            c.wait(
                lambda: c.http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
                deadline - time.monotonic(),
                "kueue /readyz",
            )
            self._install_webhooks()
            c.wait(self._webhooks_answer, deadline - time.monotonic(), "kueue webhooks answering")
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self, remove_webhooks: bool = True) -> None:
        """Stop the controller: remove its webhook configurations first (so
        the cluster keeps admitting pods without it), and afterwards the
        ``kueue.x-k8s.io/managed`` finalizer from pods still carrying it (so
        they can go away); the CRDs and Kueue objects stay."""
        c = self.cluster
        up = bool(c.pids.get("kube-apiserver"))
        if remove_webhooks and up:
            for kind, name in self.webhook_names:
                c.kubectl("delete", kind, name, "--ignore-not-found", check=False)
            self.webhook_names = []
        c.kill_component(self.NAME)
        if remove_webhooks and up:
            self._strip_finalizers()
        self._started = False

    def _strip_finalizers(self) -> None:
        r = self.cluster.kubectl("get", "pods", "-A", "-o", "json", check=False)
        if r.returncode != 0:
            return
        for p in json.loads(r.stdout)["items"]:
            fins = p["metadata"].get("finalizers") or []
            if POD_FINALIZER in fins:
                patch = [{"op": "remove", "path": f"/metadata/finalizers/{fins.index(POD_FINALIZER)}"}]
                self.cluster.kubectl(
                    "patch",
                    "pod",
                    p["metadata"]["name"],
                    "-n",
                    p["metadata"]["namespace"],
                    "--type=json",
                    "-p",
                    json.dumps(patch),
                    check=False,
                )

    # ---------------------------------------------------------- setup

    def _make_certs(self) -> None:
        """Serving certs (SAN 127.0.0.1) for the webhook server, the
        visibility server and the metrics watcher (which Kueue insists on
        reading when internalCertManagement is off; build-kueue.sh makes its
        path and the visibility server's relative to KUEUE_TESTBED_CERT_ROOT)."""
        pki = self.cluster.pki
        crt, key = pki.cert(
            "kueue-webhook", "kueue-webhook", server_sans=["IP:127.0.0.1", "DNS:localhost"], client=False
        )
        root = self.dir / "root"
        for d in (self.dir / "webhook-certs", root / "etc/kueue/metrics/certs", root / "visibility"):
            d.mkdir(parents=True, exist_ok=True)
            (d / "tls.crt").write_bytes(Path(crt).read_bytes())
            (d / "tls.key").write_bytes(Path(key).read_bytes())
            os.chmod(d / "tls.key", 0o600)

    def _to_json(self, path: Path) -> list[dict]:
        """YAML manifest -> objects (kubectl parses it; stdlib has no YAML)."""
        out = self.cluster.kubectl("create", "--dry-run=client", "-o", "json", "-f", path).stdout
        objs, dec, i = [], json.JSONDecoder(), 0
        while True:  # one JSON document per YAML document
            while i < len(out) and out[i].isspace():
                i += 1
            if i >= len(out):
                break
            obj, i = dec.raw_decode(out, i)
            objs.extend(obj["items"] if obj.get("kind") == "List" else [obj])
        return objs

    def _apply_crds(self) -> None:
        share = share_dir()
        conv = set()
        for patch in (share / "crd-patches" / "enabled.txt").read_text().split():
            m = re.search(r"^\s*name:\s*(\S+)", (share / "crd-patches" / patch).read_text(), re.M)
            if m:
                conv.add(m.group(1))
        crds = []
        for f in sorted((share / "crds").glob("*.yaml")):
            for crd in self._to_json(f):
                if crd["metadata"]["name"] in conv:
                    crd["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {
                                "url": f"{self.webhook_url}/convert",
                                "caBundle": _b64(self.cluster.pki.ca_crt),
                            },
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                crds.append(crd)
        # server-side: the CRDs are too big for the last-applied annotation
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=mpilaunch-testbed",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}),
        )
        self.cluster.wait_crds_established([crd["metadata"]["name"] for crd in crds])

    def _write_config(self) -> None:
        cfg = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},  # off
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.dir / "webhook-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "visibilityServer": {"bindAddress": "127.0.0.1"},
            "clientConnection": {"qps": 100, "burst": 200},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(EXCLUDED_NAMESPACES)}
                ]
            },
            "integrations": {"frameworks": self.frameworks},
        }
        if self.feature_gates:
            cfg["featureGates"] = self.feature_gates
        if self.wait_for_pods_ready is not None:
            cfg["waitForPodsReady"] = self.wait_for_pods_ready
        cfg.update(self.extra_config)
        # JSON is YAML
        self.config_file.write_text(json.dumps(cfg, indent=2) + "\n")

    def _install_webhooks(self) -> None:
        """Kueue's webhook configurations, for pods and Kueue's own objects
        only (the other integrations are off), pointed at 127.0.0.1."""
        share = share_dir()
        ca = _b64(self.cluster.pki.ca_crt)
        ns_selector = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(EXCLUDED_NAMESPACES)}
            ]
        }
        objs = []
        for obj in self._to_json(share / "webhook" / "manifests.yaml"):
            keep = []
            for wh in obj.get("webhooks", []):
                rules = wh.get("rules", [])
                pods = any("pods" in r.get("resources", []) and r.get("apiGroups") == [""] for r in rules)
                ours = all(r.get("apiGroups") == ["kueue.x-k8s.io"] for r in rules)
                if not (pods or ours):
                    continue
                path = wh["clientConfig"]["service"]["path"]
                wh["clientConfig"] = {"url": f"{self.webhook_url}{path}", "caBundle": ca}
                if pods:  # as config/components/webhook/kustomization.yaml patches it
                    wh["namespaceSelector"] = ns_selector
                keep.append(wh)
            obj["webhooks"] = keep
            obj["metadata"]["name"] = "kueue-" + obj["metadata"]["name"]
            objs.append(obj)
            self.webhook_names.append((obj["kind"].lower(), obj["metadata"]["name"]))
        self.cluster.apply(objs)

    def _webhooks_answer(self) -> bool:
        """A ResourceFlavor passes the webhooks (server dry-run) and a pod
        with the queue label gets Kueue's scheduling gate."""
        c = self.cluster
        rf = {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "kueue-probe"}}
        if c.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(rf), check=False).returncode != 0:
            return False
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"kueue-probe-{uuid.uuid4().hex[:6]}",
                "namespace": "default",
                "labels": {QUEUE_LABEL: "kueue-probe"},
            },
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        }
        r = c.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod), check=False)
        if r.returncode != 0:
            return False
        gates = [g["name"] for g in json.loads(r.stdout)["spec"].get("schedulingGates", [])]
        return SCHEDULING_GATE in gates

    # ---------------------------------------------------------- helpers

    def make_queue(
        self,
        cluster_queue: str,
        local_queue: str,
        namespace: str = "default",
        *,
        gpus: int | str = 0,
        cpu: int | str = 1000,
        memory: str = "4Ti",
        pods: int | None = None,
        flavor: str = "default-flavor",
        preemption: dict | None = None,
        queueing_strategy: str = "BestEffortFIFO",
    ) -> None:
        """A ResourceFlavor `flavor` (no node labels), a ClusterQueue with
        nominal quota cpu/memory/nvidia.com/gpu (and `pods` if given) in that
        flavor, and LocalQueue `namespace/local_queue` pointing at it.

        Every resource a pod requests must be a covered resource of the
        ClusterQueue, or its Workload stays pending (hence gpus is always
        covered, with quota 0 by default). `preemption`: the ClusterQueue's
        ``spec.preemption``, e.g. ``{"withinClusterQueue": "LowerPriority"}``
        (Kueue's default is Never)."""
        resources = [("cpu", str(cpu)), ("memory", str(memory)), (GPU, str(gpus))]
        if pods is not None:
            resources.append(("pods", str(pods)))
        cq_spec = {
            "namespaceSelector": {},  # every namespace (null would match none)
            "queueingStrategy": queueing_strategy,
            "resourceGroups": [
                {
                    "coveredResources": [n for n, _ in resources],
                    "flavors": [{"name": flavor, "resources": [{"name": n, "nominalQuota": q} for n, q in resources]}],
                }
            ],
        }
        if preemption:
            cq_spec["preemption"] = preemption
        self.cluster.apply(
            [
                {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {}},
                {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": cluster_queue}, "spec": cq_spec},
                {
                    "apiVersion": API,
                    "kind": "LocalQueue",
                    "metadata": {"name": local_queue, "namespace": namespace},
                    "spec": {"clusterQueue": cluster_queue},
                },
            ]
        )
        self.cluster.wait(
            lambda: self._active("clusterqueue", cluster_queue) and self._active("localqueue", local_queue, namespace),
            30,
            f"ClusterQueue {cluster_queue} / LocalQueue {local_queue} active",
        )

    def make_priority_class(self, name: str, value: int, description: str = "") -> None:
        """A WorkloadPriorityClass (pods pick it with the label
        ``kueue.x-k8s.io/priority-class``)."""
        self.cluster.apply(
            {
                "apiVersion": API,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": int(value),
                "description": description,
            }
        )

    def _active(self, kind: str, name: str, namespace: str | None = None) -> bool:
        args = [f"{kind}.kueue.x-k8s.io", name] + (["-n", namespace] if namespace else [])
        conds = self.cluster.get_json(*args).get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    def delete_group(self, group: str, namespace: str = "default", timeout: float = 60.0) -> None:
        """End pod group `group` for good: delete its Workload (named after
        the group); Kueue then deletes the group's pods and removes their
        ``kueue.x-k8s.io/managed`` finalizer. Waits until the pods are gone.

        (Deleting the pods alone is not enough: Kueue keeps the finalizer on
        the pods of an unfinished group, waiting for replacement pods, unless
        one pod carries ``kueue.x-k8s.io/retriable-in-group: "false"`` and
        none is running any more.)"""
        c = self.cluster
        c.kubectl("delete", "workloads.kueue.x-k8s.io", group, "-n", namespace, "--ignore-not-found", "--wait=false")
        # a group that never got a Workload (fewer pods than its total count)
        # loses its finalizers when its pods are deleted
        c.kubectl("delete", "pods", "-n", namespace, "-l", f"{GROUP_NAME_LABEL}={group}", "--wait=false")
        c.wait(
            lambda: not c.get_json("pods", "-n", namespace, "-l", f"{GROUP_NAME_LABEL}={group}")["items"],
            timeout,
            f"pods of group {group} gone",
        )

    def workloads(self, namespace: str = "default") -> list[dict]:
        return self.cluster.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]

    def workload_for_group(self, group: str, namespace: str = "default") -> dict | None:
        """The Workload of pod group `group` (Kueue names it after the group)."""
        for wl in self.workloads(namespace):
            if wl["metadata"]["name"] == group:
                return wl
        return None

    def pending_workloads(self, local_queue: str, namespace: str = "default") -> dict:
        """The visibility API's pending workloads of a LocalQueue (with
        positionInClusterQueue / positionInLocalQueue), asked directly of
        Kueue's visibility server (no APIService is registered)."""
        # it serves the testbed's cert (kueue-webhook, SAN 127.0.0.1); authn/authz are
        # delegated to the API server (TokenReview/SubjectAccessReview): admin cert
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki.ca_crt))
        ctx.load_cert_chain(*map(str, self.cluster.admin))
        url = (
            f"https://127.0.0.1:{self.visibility_port}/apis/visibility.kueue.x-k8s.io/v1beta2/"
            f"namespaces/{namespace}/localqueues/{local_queue}/pendingworkloads"
        )
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return json.loads(r.read())


__all__ = [
    "Kueue",
    "ensure_built",
    "pod_group_metadata",
    "QUEUE_LABEL",
    "GROUP_NAME_LABEL",
    "GROUP_TOTAL_COUNT_ANNOTATION",
    "PRIORITY_CLASS_LABEL",
    "SCHEDULING_GATE",
    "POD_FINALIZER",
    "RETRIABLE_IN_GROUP_ANNOTATION",
]
