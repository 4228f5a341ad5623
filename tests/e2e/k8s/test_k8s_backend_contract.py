"""The backend contract (tests/support/backend_contract.py) on the Kubernetes backend, against the kwok testbed."""

from __future__ import annotations

import sys

import pytest

from mpilaunch.backends.k8s.backend import K8sBackend
from mpilaunch.backends.k8s.options import K8sOptions
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from support.backend_contract import assert_exec_context_serves_the_shim, assert_release_is_idempotent, ready
from support.k8s import leftover_objects

pytestmark = pytest.mark.k8s


@pytest.fixture
def backend(kube, monkeypatch, tmp_path, request):
    # kwok runs the pods' commands on this machine, where mpilaunch is (as the k8s_env fixture says)
    monkeypatch.setenv("MPILAUNCH_K8S_TOOLS", "image")
    monkeypatch.setenv("MPILAUNCH_K8S_PYTHON", sys.executable)
    job = f"contract-{request.node.name.split('_')[1]}"
    spec = JobSpec(
        command=("true",),
        backend="k8s",
        launcher="local",
        name=job,
        backend_options=K8sOptions(image="mpilaunch:test", kubeconfig=str(kube.kubeconfig)),
    )
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    made = K8sBackend(spec, Plan(job, tuple(WorkerPlan(f"{job}-worker-{i}", 2, 0) for i in range(2))), rundir)
    yield made
    made.release()
    assert leftover_objects(kube, job) == []


def test_release_is_idempotent(backend):
    backend.release()  # before allocate
    ready(backend, timeout=120)
    assert_release_is_idempotent(backend)


def test_exec_context_serves_the_shim(backend, tmp_path):
    ready(backend, timeout=120)
    assert_exec_context_serves_the_shim(backend, tmp_path)
