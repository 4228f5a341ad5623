"""A real Volcano gang scheduler on the Kubernetes testbed.

Runs Volcano's ``vc-scheduler`` and ``vc-controller-manager`` (built from
source by ``build-volcano.sh``) as processes of a ``KubeCluster``, so pods
with ``schedulerName: volcano`` in a ``scheduling.volcano.sh`` PodGroup are
gang-scheduled onto kwok nodes: all ``minMember`` pods bind, or none does.

The webhook-manager is not run: it only validates/defaults Volcano objects
(and mutates vcjobs), and the testbed writes complete PodGroups itself.

    from testbeds.k8s.cluster import KubeCluster
    from testbeds.k8s.volcano import Volcano
    with KubeCluster() as c:
        c.create_nodes(2, gpus=8)
        vc = Volcano(c).start()      # stopped by c.stop() too
        ...
        vc.stop()

Stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from .common import ClusterError, cache_dir

if TYPE_CHECKING:  # an annotation only: the caller makes the cluster
    from .cluster import KubeCluster

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build-volcano.sh"
VOLCANO_VERSION = os.environ.get("VOLCANO_VERSION", "v1.10.0")

#: pods opt in with ``spec.schedulerName``; the group is the pod annotation
SCHEDULER_NAME = "volcano"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
DEFAULT_QUEUE = "default"
# the probe pod's image: only its binding counts; should it land on the real node, the kubelet
# has this one (node_config.PAUSE_IMAGE) and pulls nothing
PROBE_IMAGE = "mpilaunch.local/pause:1"

# The CRDs the two binaries list/watch. batch.volcano.sh Jobs (a 200 KB
# CRD) are left out: only the job/gc/jobflow controllers watch them, and
# those are not run (see CONTROLLERS). Commands are watched by the queue
# controller; Numatopologies by the scheduler (ResourceTopology gate, on by
# default).
CRDS = (
    "scheduling.volcano.sh_podgroups.yaml",
    "scheduling.volcano.sh_queues.yaml",
    "bus.volcano.sh_commands.yaml",
    "nodeinfo.volcano.sh_numatopologies.yaml",
)
# pg-controller: gives a volcano pod without a group annotation its own
# one-pod PodGroup (what Volcano does for plain pods); queue-controller:
# moves Queues to state Open and keeps their status counts. vc-scheduler
# v1.10 alone binds gangs (it ignores Queue state; the webhook, not run
# here, is what refuses closed queues), but a cluster without these two
# would differ from a real Volcano install.
CONTROLLERS = "pg-controller,queue-controller"

# Volcano's default scheduler conf (pkg/scheduler/util.go, Helm chart) plus
# binpack: enqueue admits a PodGroup only when its minResources fit the
# queue; allocate binds a gang only when minMember tasks found nodes (the
# gang plugin's JobReady), else it discards the whole tentative allocation.
SCHEDULER_CONF = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""


def bin_dir() -> Path:
    return cache_dir() / "bin"


def crd_dir() -> Path:
    return cache_dir() / "share" / f"volcano-{VOLCANO_VERSION}" / "crd"


def _names() -> dict[str, str]:
    return {c: f"vc-{c}-{VOLCANO_VERSION}" for c in ("scheduler", "controller-manager")}


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) vc-scheduler/vc-controller-manager and the
    CRDs; return the bin directory. A cold build takes ~2-3 min on 2 cores."""
    missing = [n for n in _names().values() if not os.access(bin_dir() / n, os.X_OK)]
    if missing or not all((crd_dir() / c).exists() for c in CRDS):
        if not quiet:
            print(f"[volcano] building {', '.join(missing) or 'CRDs'} via {BUILD_SH}", file=sys.stderr)
        env = {**os.environ, "VOLCANO_VERSION": VOLCANO_VERSION}
        subprocess.run(["bash", str(BUILD_SH)], check=True, env=env, stdout=subprocess.DEVNULL if quiet else None)
    return bin_dir()


class Volcano:
    """vc-scheduler + vc-controller-manager for one running KubeCluster."""

    COMPONENTS = ("vc-controller-manager", "vc-scheduler")

    def __init__(self, cluster: KubeCluster, verbosity: int = 2, schedule_period: str = "1s"):
        self.cluster = cluster
        self.verbosity = verbosity
        self.schedule_period = schedule_period
        self.conf = cluster.workdir / "volcano-scheduler.conf"
        self.start_seconds: float | None = None

    def bin_dir(self) -> Path:
        return bin_dir()

    def ensure_built(self) -> Path:
        return ensure_built()

    # ---------------------------------------------------------- lifecycle

    def start(self, timeout: float = 120.0) -> "Volcano":
        t0 = time.monotonic()
        bindir = self.ensure_built()
        c = self.cluster
        self._apply_crds(timeout)
        # Admin (system:masters) client: Volcano's own ClusterRoles are long
        # lists (pods/binding, podgroups, queues/status, events, nodes,
        # PVs, CSI objects, ...) that would only restate "everything" here.
        kc = c.client_kubeconfig(c.workdir / "volcano.kubeconfig", "volcano", orgs=("system:masters",))
        self.conf.write_text(SCHEDULER_CONF)
        try:
            # No --enable-healthz/--enable-metrics: they would need ports,
            # and healthz is up before the caches sync, so it proves nothing;
            # readiness is the probe pod below.
            c.spawn(
                "vc-controller-manager",
                [
                    bindir / _names()["controller-manager"],
                    f"--kubeconfig={kc}",
                    "--leader-elect=false",
                    f"--controllers={CONTROLLERS}",
                    f"--scheduler-name={SCHEDULER_NAME}",
                    f"--v={self.verbosity}",
                ],
            )
            c.spawn(
                "vc-scheduler",
                [
                    bindir / _names()["scheduler"],
                    f"--kubeconfig={kc}",
                    "--leader-elect=false",
                    f"--scheduler-conf={self.conf}",
                    f"--scheduler-name={SCHEDULER_NAME}",
                    f"--default-queue={DEFAULT_QUEUE}",
                    f"--schedule-period={self.schedule_period}",
                    # SIGUSR2 dumps the cache as JSON; keep that out of /tmp
                    f"--cache-dump-dir={c.workdir / 'logs'}",
                    f"--v={self.verbosity}",
                ],
            )
            deadline = time.monotonic() + timeout
            # vc-scheduler creates the default Queue, the queue controller
            # opens it: Open proves both are up and talking to the API server
            c.wait(
                lambda: self.queue_state(DEFAULT_QUEUE) == "Open",
                deadline - time.monotonic(),
                f"Volcano queue {DEFAULT_QUEUE!r} Open",
                interval=0.5,
            )
            self._probe(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill both processes (KubeCluster.stop() would also get them, by
        the environment marker). The CRDs and Volcano objects stay."""
        for name in self.COMPONENTS:
            self.cluster.kill_component(name)

    # ---------------------------------------------------------- helpers

    def _apply_crds(self, timeout: float) -> None:
        c = self.cluster
        files = [str(crd_dir() / n) for n in CRDS]
        # server-side: no last-applied annotation (the size limit bites big CRDs)
        c.kubectl("apply", "--server-side", "--force-conflicts", *sum((["-f", f] for f in files), []))
        names = [f"{n.split('_', 1)[1].removesuffix('.yaml')}.{n.split('_', 1)[0]}" for n in CRDS]
        c.wait_crds_established(names, timeout)

    def queue_state(self, name: str = DEFAULT_QUEUE) -> str | None:
        p = self.cluster.kubectl(
            "get", "queues.scheduling.volcano.sh", name, "-o", "jsonpath={.status.state}", check=False
        )
        return p.stdout.strip() or None if p.returncode == 0 else None

    def _probe(self, timeout: float) -> None:
        """A one-pod gang must get bound to a node: the scheduler's caches
        synced and its session loop runs. Needs a schedulable node; with
        none yet (create_nodes not called) only the queue check stands."""
        c = self.cluster
        nodes = c.get_json("nodes")["items"]
        if not any(not n["spec"].get("unschedulable") for n in nodes):
            return
        name = f"volcano-probe-{uuid.uuid4().hex[:6]}"
        ns = "default"
        probe = pod(name, name, namespace=ns, requests={"cpu": "1m"}, image=PROBE_IMAGE)
        # any node will do, the real node's tainted one too (a cluster of it alone: the real-pod tests)
        probe["spec"]["tolerations"] = [{"operator": "Exists"}]
        probe["spec"]["containers"][0].pop("command")  # the pause image's own
        c.apply([podgroup(name, 1, namespace=ns), probe])
        try:
            c.wait(
                lambda: c.get_json("pod", name, "-n", ns)["spec"].get("nodeName"),
                timeout,
                "Volcano probe pod bound",
                interval=0.5,
            )
        except ClusterError as e:
            raise ClusterError(f"{e}\nvc-scheduler log:\n{c.log_tail('vc-scheduler')}") from None
        finally:
            c.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force", "--wait=false", check=False)
            c.kubectl("delete", "podgroups.scheduling.volcano.sh", name, "-n", ns, "--wait=false", check=False)


# -------------------------------------------------------------- manifests


def podgroup(
    name: str,
    min_member: int,
    namespace: str = "default",
    queue: str = DEFAULT_QUEUE,
    min_resources: dict | None = None,
) -> dict:
    """A scheduling.volcano.sh/v1beta1 PodGroup. ``min_resources`` (e.g.
    ``{"nvidia.com/gpu": 16}``) makes the enqueue action hold the group in
    phase Pending until the queue has that much room."""
    spec = {"minMember": min_member, "queue": queue}
    if min_resources:
        spec["minResources"] = {k: str(v) for k, v in min_resources.items()}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pod(
    name: str, group: str, namespace: str = "default", requests: dict | None = None, image: str = "busybox"
) -> dict:
    """A pod Volcano schedules as a member of PodGroup ``group``."""
    res = {k: str(v) for k, v in (requests or {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {GROUP_ANNOTATION: group}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sleep", "inf"],
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def podgroup_status(cluster: KubeCluster, name: str, namespace: str = "default") -> dict:
    """``status`` of a PodGroup: phase (Pending/Inqueue/Running/...),
    conditions (Unschedulable's message says why), running/succeeded/failed."""
    return cluster.get_json("podgroups.scheduling.volcano.sh", name, "-n", namespace).get("status", {})


if __name__ == "__main__":  # build only: python -m testbeds.k8s.volcano
    print(json.dumps({"bin_dir": str(ensure_built()), "crds": str(crd_dir())}))
