"""The testbed's Kueue (testbeds/k8s/kueue.py): plain pods as one pod group, admitted all or nothing."""

from __future__ import annotations

import json
import os

import pytest

from support.mpi_installs import require

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def kq():
    """Its own small cluster (2 nodes x 8 GPUs) with Kueue (pod integration)."""
    try:
        from testbeds.k8s import kueue
        from testbeds.k8s.cluster import KubeCluster
    except ImportError as e:
        require(f"Kubernetes testbed not importable: {e}")
    if not (os.access(kueue.binary_path(), os.X_OK) and (kueue.share_dir() / ".complete").exists()):
        require(f"Kueue not built (run {kueue.BUILD_SH}; ~4 min cold)")
    c = KubeCluster()
    try:
        c.start()
        c.create_nodes(2, gpus=8, prefix="kq")
        k = kueue.Kueue(c).start()
    except Exception as e:
        c.stop()
        require(f"Kubernetes testbed with Kueue did not start: {e}")
    yield k
    k.stop()
    leftover = [
        p["metadata"]["name"]
        for p in c.get_json("pods", "-A")["items"]
        if kueue.POD_FINALIZER in (p["metadata"].get("finalizers") or [])
    ]
    c.stop()
    assert leftover == []


def _group(k, name, queue, workers, gpus, priority_class=None):
    """A launcher pod (no GPU) + `workers` pods with `gpus` GPUs each, as one pod group."""
    from testbeds.k8s.kueue import pod_group_metadata

    total = workers + 1
    pods = []
    for i, role in enumerate(["launcher"] + ["worker"] * workers):
        req = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if role == "worker" else {})}
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": "default",
                    **pod_group_metadata(queue, name, total, priority_class),
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "resources": {"requests": req, "limits": req}}],
                },
            }
        )
    k.cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    return [p["metadata"]["name"] for p in pods]


def _pods(k, names):
    byname = {p["metadata"]["name"]: p for p in k.cluster.get_json("pods", "-n", "default")["items"]}
    return [byname.get(n) for n in names]


def _running(k, names):
    return all(p and p["spec"].get("nodeName") and not p["spec"].get("schedulingGates") for p in _pods(k, names))


def _condition(wl, type_):
    return next((c for c in (wl or {}).get("status", {}).get("conditions", []) if c["type"] == type_), None)


def test_a_pod_group_is_admitted_only_when_all_of_it_fits(kq):
    from testbeds.k8s.kueue import SCHEDULING_GATE

    kq.make_queue("cq-fit", "lq-fit", gpus=8, cpu=64, memory="256Gi")
    a = _group(kq, "fit-a", "lq-fit", workers=2, gpus=4)  # all 8 GPUs of the quota
    kq.cluster.wait(lambda: _running(kq, a), 60, "group fit-a admitted and bound")
    assert _condition(kq.workload_for_group("fit-a"), "Admitted")["status"] == "True"

    b = _group(kq, "fit-b", "lq-fit", workers=2, gpus=2)  # 4 more: does not fit
    kq.cluster.wait(
        lambda: (_condition(kq.workload_for_group("fit-b"), "QuotaReserved") or {}).get("reason") == "Pending",
        60,
        "group fit-b pending",
    )
    cond = _condition(kq.workload_for_group("fit-b"), "QuotaReserved")
    assert cond["status"] == "False"
    assert "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 4 more needed" in cond["message"]
    for p in _pods(kq, b):  # none of the group passes the gate, the launcher included
        assert SCHEDULING_GATE in [g["name"] for g in p["spec"]["schedulingGates"]]
        assert not p["spec"].get("nodeName")
    # v1beta1 reads go through Kueue's conversion webhook (v1beta2 is stored)
    old = kq.cluster.get_json("workloads.v1beta1.kueue.x-k8s.io", "fit-b", "-n", "default")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1" and old["spec"]["queueName"] == "lq-fit"
    pending = kq.pending_workloads("lq-fit")["items"]
    assert [(w["metadata"]["name"], w["positionInLocalQueue"]) for w in pending] == [("fit-b", 0)]

    kq.delete_group("fit-a")  # its pods are gone, finalizers and all
    kq.cluster.wait(lambda: _running(kq, b), 60, "group fit-b admitted once fit-a is gone")
    kq.delete_group("fit-b")


def test_a_higher_priority_group_preempts_a_whole_group(kq):
    kq.make_queue(
        "cq-pre", "lq-pre", gpus=8, cpu=64, memory="256Gi", preemption={"withinClusterQueue": "LowerPriority"}
    )
    kq.make_priority_class("kq-low", 100)
    kq.make_priority_class("kq-high", 1000)
    low = _group(kq, "pre-low", "lq-pre", workers=2, gpus=4, priority_class="kq-low")
    kq.cluster.wait(lambda: _running(kq, low), 60, "group pre-low admitted")
    high = _group(kq, "pre-high", "lq-pre", workers=2, gpus=2, priority_class="kq-high")
    kq.cluster.wait(lambda: _running(kq, high), 60, "group pre-high admitted")

    wl = kq.workload_for_group("pre-low")
    assert _condition(wl, "Evicted")["reason"] == "Preempted"
    assert _condition(wl, "Preempted")["reason"] == "InClusterQueue"
    assert _condition(wl, "QuotaReserved")["status"] == "False"
    # Kueue deletes the preempted pods (no gating again), each marked with why
    for p in _pods(kq, low):
        assert p["metadata"].get("deletionTimestamp")
        tt = next(c for c in p["status"]["conditions"] if c["type"] == "TerminationTarget")
        assert tt["reason"] == "WorkloadEvictedDueToPreempted"
        assert tt["message"].startswith("Preempted to accommodate a workload")
    kq.delete_group("pre-low")
    kq.delete_group("pre-high")
