"""A job's name used again while the objects of an earlier job of that name are still going, and a
name whose objects are someone else's, against the kwok testbed's real control plane (its garbage
collector is the real kube-controller-manager's; ``kube`` fixture).

Seen on the real node: a job rerun seconds after the reaper ended one of the same name failed
with "cannot create ConfigMap X-tools: already exists" and the hint "check the API server and
your kubeconfig", although the old object was only waiting for the garbage collector.
"""

from __future__ import annotations

import json

import pytest

from support.helpers import wait_for
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects, start, stop

pytestmark = pytest.mark.k8s

HOLD = "mpilaunch.test/hold"


def lease(name: str, owner: dict | None = None, finalizers: list[str] | None = None) -> str:
    """A Lease named like every attached job's (``<job>``)."""
    meta = {"name": name, "labels": {"test": "name-reuse"}}
    if owner:
        meta["ownerReferences"] = [owner]
    if finalizers:
        meta["finalizers"] = finalizers
    return json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {}})


def earlier_jobs_lease_being_deleted(kube, job: str) -> None:
    """What an earlier job named ``job`` leaves when its root was deleted a moment ago: its Lease,
    owned by that root, marked for deletion by the garbage collector and held there by a finalizer
    until the test lets it go (as a pod's grace period holds a worker)."""
    root = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": job}}
    kube.kubectl("create", "-f", "-", input=json.dumps(root))
    root_uid = kube.kubectl("get", "configmap", job, "-o", "jsonpath={.metadata.uid}").stdout
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": job, "uid": root_uid}
    kube.kubectl("create", "-f", "-", input=lease(job, owner, [HOLD]))
    kube.kubectl("delete", "configmap", job, "--wait=false")
    wait_for(
        lambda: kube.kubectl("get", "lease", job, "-o", "jsonpath={.metadata.deletionTimestamp}").stdout,
        60,
        "the garbage collector to mark the earlier job's Lease for deletion",
    )


def let_go(kube, name: str) -> None:
    kube.kubectl("patch", "lease", name, "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')


def test_name_reuse_waits_out_an_earlier_jobs_objects_then_runs(kube, k8s_env, tmp_path):
    job = "nr-earlier"
    earlier_jobs_lease_being_deleted(kube, job)
    give_pods_their_env(kube, job, 2, tmp_path)
    proc = start(["--name", job, "--np", "2", "--slots-per-worker", "1", "--launcher", "local", "--", "true"], k8s_env)
    try:
        waiting = f"mpilaunch: waiting for Lease {job} of an earlier job named {job} to be deleted"
        said = []
        wait_for(lambda: said.append(proc.stderr.readline()) or said[-1].strip() == waiting, 60, waiting)
        assert proc.poll() is None, "".join(said)
        let_go(kube, job)
        out, err = proc.communicate(timeout=180)
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
    err = "".join(said) + err
    assert proc.returncode == 0, err[-3000:]
    assert err.count(waiting) == 1, err
    assert leftover_objects(kube, job) == []


def test_name_reuse_an_object_that_is_no_jobs_is_refused_and_left_alone(kube, k8s_env):
    job = "nr-stranger"
    kube.kubectl("create", "-f", "-", input=lease(job))
    try:
        proc = start(
            ["--name", job, "--np", "2", "--slots-per-worker", "1", "--launcher", "local", "--", "true"], k8s_env
        )
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert lines[0] == (
            f"mpilaunch: error: Lease {job} already exists in namespace default and is not mpilaunch job {job}'s"
        ), err
        assert lines[1].startswith("  hint: choose another --name"), err
        # the stranger's object is untouched; everything the job made is gone
        assert kube.kubectl("get", "lease", job, "-o", "jsonpath={.metadata.labels.test}").stdout == "name-reuse"
        assert leftover_objects(kube, job) == []
    finally:
        kube.kubectl("delete", "lease", job, "--ignore-not-found")
