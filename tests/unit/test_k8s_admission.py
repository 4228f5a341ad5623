"""--gang and --queue: what makes a pod a member, and what a waiting job says, in the scheduler's or Kueue's words.

The objects' shapes are those the real Volcano v1.10 and Kueue v0.17 of the
testbed wrote (tests/e2e/k8s/test_gang.py, test_queue.py run them).
"""

from __future__ import annotations

import pytest

from mpilaunch.backends.k8s import admission
from mpilaunch.backends.k8s.options import K8sOptions
from mpilaunch.core.errors import UsageError


def test_gang_membership_by_scheduler():
    assert admission.gang_membership("volcano", "j") == ({}, {"scheduling.k8s.io/group-name": "j"})
    assert admission.gang_membership("coscheduling", "j") == ({"scheduling.x-k8s.io/pod-group": "j"}, {})
    assert admission.gang_membership("none", "j") == ({}, {})


def test_queue_membership_is_one_kueue_pod_group_of_the_workers():
    labels, annotations = admission.queue_membership("team-a", "j", 16)
    assert labels == {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/pod-group-name": "j"}
    # not retriable: a deleted or failed member ends the group, so Kueue's finalizer never holds the pods
    assert annotations == {"kueue.x-k8s.io/pod-group-total-count": "16", "kueue.x-k8s.io/retriable-in-group": "false"}
    assert admission.queue_membership(None, "j", 16) == ({}, {})


def test_podgroup_note_quotes_volcanos_condition_until_the_gang_runs():
    said = (
        "3/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable; Pending: 3 Unschedulable"
    )
    pending = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": said}
            ],
        }
    }
    assert admission.podgroup_note("volcano", pending) == f"gang not scheduled (volcano PodGroup Pending): {said}"
    assert (
        admission.podgroup_note("volcano", {"status": {"phase": "Inqueue"}})
        == "gang not scheduled (volcano PodGroup Inqueue)"
    )
    # no condition: the PodGroup's latest warning event says it
    assert (
        admission.podgroup_note("volcano", {"status": {"phase": "Pending"}}, "queue resource quota insufficient")
        == "gang not scheduled (volcano PodGroup Pending): queue resource quota insufficient"
    )
    # Volcano leaves the old Unschedulable condition on a running PodGroup: the phase decides
    assert admission.podgroup_note("volcano", {"status": {**pending["status"], "phase": "Running"}}) is None
    assert admission.podgroup_note("volcano", None) is None


def test_workload_note_names_the_queue_and_quotes_kueue_until_admitted():
    said = (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
        "default-flavor, 16 more needed"
    )
    workload = {
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": said}]}
    }
    local_queue = {"spec": {"clusterQueue": "gpus"}, "status": {"pendingWorkloads": 2}}
    assert (
        admission.workload_note("team-a", workload, local_queue)
        == f"queued in Kueue LocalQueue team-a (ClusterQueue gpus, 2 pending): {said}"
    )
    admitted = {"status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    assert admission.workload_note("team-a", admitted, local_queue) is None
    assert (
        admission.workload_note("team-a", None, None)
        == "queued in Kueue LocalQueue team-a: waiting for Kueue's Workload"
    )
    assert "is its pod integration on" in admission.workload_note("team-a", None, None, waited=20)


def test_workload_eviction_says_why_kueue_took_the_pods_back():
    workload = {
        "status": {
            "conditions": [
                {"type": "Admitted", "status": "False"},
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": "Preempted",
                    "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue",
                },
            ]
        }
    }
    assert admission.workload_eviction(workload) == (
        "evicted by Kueue (Preempted: Preempted to accommodate a workload (UID: 1) due to prioritization in the "
        "ClusterQueue)"
    )
    assert admission.workload_eviction({"status": {"conditions": []}}) is None


def test_options_take_the_old_gang_name_and_refuse_a_bad_queue():
    assert K8sOptions(gang="scheduler-plugins").gang == "coscheduling"
    with pytest.raises(UsageError, match="--gang"):
        K8sOptions(gang="yunikorn")
    with pytest.raises(UsageError, match="invalid --queue"):
        K8sOptions(queue="Team A")
    assert K8sOptions(queue="team-a.gpu").queue == "team-a.gpu"


def test_a_pod_kueue_stopped_is_lost_to_kueue_in_its_words():
    from mpilaunch.backends.k8s.pods import pod_loss

    said = "Preempted to accommodate a workload (UID: 1, JobUID: UNKNOWN) due to prioritization in the ClusterQueue"
    pod = {
        "metadata": {"deletionTimestamp": "2026-11-26T04:50:00Z"},
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "TerminationTarget",
                    "status": "True",
                    "reason": "WorkloadEvictedDueToPreempted",
                    "message": said,
                }
            ],
        },
    }
    assert pod_loss(pod) == f"evicted by Kueue (Preempted: {said})"
