"""The backend contract (tests/support/backend_contract.py) on the ssh backend, against real sshd hosts."""

from __future__ import annotations

import pytest

from mpilaunch.backends.ssh.backend import SshBackend
from mpilaunch.backends.ssh.options import SshOptions
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from support.backend_contract import assert_exec_context_serves_the_shim, assert_release_is_idempotent, ready

pytestmark = pytest.mark.ssh


@pytest.fixture
def backend(bed, tmp_path):
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-1 slots=2\nnode-2 slots=2\n")
    spec = JobSpec(
        command=("true",),
        backend="ssh",
        hostfile=str(hosts),
        name="contract",
        backend_options=SshOptions(ssh_command=bed.ssh_command),
    )
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    made = SshBackend(spec, Plan("contract", (WorkerPlan("node-1", 2, 0), WorkerPlan("node-2", 2, 0))), rundir)
    yield made
    made.release()


def test_release_is_idempotent_and_leaves_the_hosts_clean(backend, bed):
    backend.release()  # before allocate
    ready(backend)
    assert_release_is_idempotent(backend)
    assert {host: bed.leftovers(host) for host in ("node-1", "node-2") if bed.leftovers(host)} == {}


def test_exec_context_serves_the_shim(backend, tmp_path):
    ready(backend)
    assert_exec_context_serves_the_shim(backend, tmp_path)
