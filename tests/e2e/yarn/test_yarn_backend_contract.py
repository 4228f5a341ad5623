"""The backend contract (tests/support/backend_contract.py) on the YARN backend, against the YARN testbed."""

from __future__ import annotations

import pytest

from mpilaunch.backends.yarn.backend import YarnBackend
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from support.backend_contract import assert_exec_context_serves_the_shim, assert_release_is_idempotent, ready

pytestmark = pytest.mark.yarn


@pytest.fixture
def backend(openmpi_env, monkeypatch, tmp_path, request):
    for name, value in openmpi_env["env"].items():  # the testbed's client settings, as a user's shell has them
        monkeypatch.setenv(name, value)
    job = f"contract-{request.node.name.split('_')[1]}"
    spec = JobSpec(command=("true",), backend="yarn", launcher="local", name=job)
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    made = YarnBackend(spec, Plan(job, tuple(WorkerPlan(f"{job}-worker-{i}", 1, 0) for i in range(2))), rundir)
    yield made
    made.release()


def test_release_is_idempotent_and_ends_the_application(backend, yarn):
    backend.release()  # before allocate
    ready(backend, timeout=180)
    assert_release_is_idempotent(backend, settle=30)
    app = next(a for a in yarn.apps() if a["id"] == backend.app_id)
    assert app["state"] in ("FINISHED", "KILLED", "FAILED")


def test_exec_context_serves_the_shim(backend, tmp_path):
    ready(backend, timeout=180)
    assert_exec_context_serves_the_shim(backend, tmp_path)
