"""The order in which a job's objects are created (``creation.CREATION_STAGES``), over the manifests
that ``render`` shows for each kind of job: every object is in a stage, what pods mount or use comes
before them, and the reaper exists before any pod of the job, so a job is reaped if mpilaunch dies
from the first pod on."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jinja2")

from mpilaunch.backends.k8s import creation
from mpilaunch.backends.k8s import manifests as k8s_manifests
from mpilaunch.backends.k8s.backend import K8sBackend
from mpilaunch.backends.k8s.creation import CREATION_STAGES
from mpilaunch.cli import parse_run
from mpilaunch.workloads.mpirun import MpirunWorkload


def stage_of(group: str) -> int:
    (index,) = [i for i, stage in enumerate(CREATION_STAGES) if group in stage]
    return index


@pytest.mark.parametrize(
    "args",
    [
        ["--launcher", "cluster"],
        ["--launcher", "local"],
        ["--launcher", "cluster", "--detach"],
        ["--launcher", "cluster", "--gang", "volcano"],
        ["--launcher", "local", "--transport", "exec"],
    ],
)
def test_every_object_has_a_stage_and_the_reaper_comes_before_any_pod(args, tmp_path):
    spec, _ = parse_run(
        [
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            "order",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            *args,
            "--",
            "python3",
            "train.py",
        ]
    )
    workload = MpirunWorkload.prepare(spec, K8sBackend, "order", dict(os.environ))
    backend = K8sBackend(spec, workload.plan, tmp_path, cluster_launcher_allowed=workload.can_use_cluster_launcher)
    groups = [group for group, _ in k8s_manifests.manifests(backend)]
    assert groups[0] == "root" and "workers" in groups
    assert all(any(g in stage for stage in CREATION_STAGES) for g in groups[1:]), groups
    pods = [stage_of(g) for g in groups if g in ("workers", "launcher")]
    firsts = [stage_of(g) for g in groups if g in ("tools", "setup", "lease", "reaper-rbac")]
    reaper = [stage_of(g) for g in groups if g == "reaper"]
    assert reaper, groups  # every job has one: it removes the job should mpilaunch die
    assert max(firsts) < reaper[0] < min(pods)


def owned_by(*roots: tuple[str, str, str]) -> dict:
    return {"metadata": {"ownerReferences": [{"kind": k, "name": n, "uid": u} for k, n, u in roots]}}


@pytest.mark.parametrize(
    "existing, expected",
    [
        # the create was sent again after its answer was lost: already this job's
        (owned_by(("ConfigMap", "bert", "uid-now")), creation.THIS_JOB),
        # an earlier job of the same name: its root (another uid) is gone, the garbage collector removes it
        (owned_by(("ConfigMap", "bert", "uid-before")), creation.EARLIER_JOB),
        # nobody's, another job's root, or an owner of another kind: never waited for, never touched
        ({"metadata": {}}, creation.NOT_A_JOB),
        (owned_by(("ConfigMap", "gpt", "uid-before")), creation.NOT_A_JOB),
        (owned_by(("Deployment", "bert", "uid-before")), creation.NOT_A_JOB),
    ],
)
def test_whose_object_a_create_ran_into(existing, expected):
    assert creation.whose(existing, "bert", "uid-now") == expected
