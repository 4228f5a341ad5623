"""The testbed's Volcano (testbeds/k8s/volcano.py) really gang-schedules: all or nothing."""

from __future__ import annotations

import os
import time

import pytest

from support.mpi_installs import require

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def vc():
    """Its own small cluster (2 nodes x 8 GPUs), so capacity is exact."""
    try:
        from testbeds.k8s import volcano
        from testbeds.k8s.cluster import KubeCluster
    except ImportError as e:
        require(f"Kubernetes testbed not importable: {e}")
    if not all(os.access(volcano.bin_dir() / n, os.X_OK) for n in volcano._names().values()):
        require(f"Volcano not built (run {volcano.BUILD_SH}; ~2-3 min cold)")
    c = KubeCluster()
    try:
        c.start()
        c.create_nodes(2, gpus=8, prefix="vc")
        volcano.Volcano(c).start()
    except Exception as e:
        c.stop()
        require(f"Kubernetes testbed with Volcano did not start: {e}")
    yield c
    c.stop()


def _bound(c, names):
    pods = {p["metadata"]["name"]: p for p in c.get_json("pods", "-n", "default")["items"]}
    return {n for n in names if pods.get(n, {}).get("spec", {}).get("nodeName")}


def _gang(c, pg, n, gpus, min_resources=None):
    from testbeds.k8s.volcano import pod, podgroup

    names = [f"{pg}-{i}" for i in range(n)]
    c.apply(
        [podgroup(pg, n, min_resources=min_resources)] + [pod(x, pg, requests={"nvidia.com/gpu": gpus}) for x in names]
    )
    return names


def test_a_gang_that_does_not_fit_binds_no_pod_and_says_why(vc):
    from testbeds.k8s.volcano import podgroup_status

    c = vc
    names = _gang(c, "toobig", 3, 8)  # 24 GPUs wanted, 16 there
    c.wait(
        lambda: any(x.get("type") == "Unschedulable" for x in podgroup_status(c, "toobig").get("conditions", [])),
        60,
        "PodGroup toobig Unschedulable",
        interval=0.5,
    )
    time.sleep(3)  # a few more scheduling cycles: still nothing bound
    assert _bound(c, names) == set()
    st = podgroup_status(c, "toobig")
    cond = [x for x in st["conditions"] if x["type"] == "Unschedulable"][-1]
    assert cond["reason"] == "NotEnoughResources", st
    # e.g. "1/3 tasks in gang unschedulable: pod group is not ready, 3 Pending,
    # 3 minAvailable; Pending: 1 Unschedulable, 2 Schedulable"
    assert "tasks in gang unschedulable: pod group is not ready" in cond["message"], st
    assert "3 minAvailable" in cond["message"], st
    assert st["phase"] == "Inqueue", st  # no minResources: enqueue lets it in
    # one member fewer (and minMember 2): the rest fits, and binds together
    c.kubectl("delete", "pod", names[2], "--grace-period=0", "--force")
    c.kubectl("patch", "podgroups.scheduling.volcano.sh", "toobig", "--type=merge", "-p", '{"spec":{"minMember":2}}')
    c.wait(lambda: _bound(c, names[:2]) == set(names[:2]), 60, "both pods bound", interval=0.5)
    c.wait(lambda: podgroup_status(c, "toobig").get("phase") == "Running", 60, "PodGroup Running", interval=0.5)
    c.kubectl("delete", "pods", *names[:2], "--grace-period=0", "--force")
    c.kubectl("delete", "podgroups.scheduling.volcano.sh", "toobig")


def test_of_two_gangs_wanting_all_gpus_exactly_one_binds(vc):
    c = vc
    a = _gang(c, "gang-a", 2, 8, min_resources={"nvidia.com/gpu": 16})
    b = _gang(c, "gang-b", 2, 8, min_resources={"nvidia.com/gpu": 16})
    c.wait(lambda: len(_bound(c, a + b)) >= 2, 60, "one gang bound", interval=0.5)
    time.sleep(3)
    bound = _bound(c, a + b)
    assert bound in (set(a), set(b)), bound
    from testbeds.k8s.volcano import podgroup_status

    # minResources: the enqueue action keeps the loser out of the queue
    phases = {g: podgroup_status(c, g).get("phase") for g in ("gang-a", "gang-b")}
    assert sorted(phases.values()) == ["Pending", "Running"], phases
    c.kubectl("delete", "pods", *a, *b, "--grace-period=0", "--force")
    c.kubectl("delete", "podgroups.scheduling.volcano.sh", "gang-a", "gang-b")
