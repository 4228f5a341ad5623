"""Open MPI 5 with several local workers: each worker's agent takes its worker's name for host name.

PRRTE names a node after its daemon's gethostname(), and PMIx merges nodes of one name: two
local workers' daemons would be one node to the ranks, whose MPI_COMM_TYPE_SHARED splits then
disagree (core/mpi/openmpi.py, agent/hostname.py). What is decided where, without a process:
the flavour says whether it needs host names of their own, the mpirun workload asks for them
where there are several workers, and the local backend passes ``--hostname <worker>`` to each
agent where this machine lets a process name its host, and warns where it does not.
"""

from __future__ import annotations

import os

import pytest

from mpilaunch.agent import cli as agent_cli
from mpilaunch.agent import hostname
from mpilaunch.backends.local import backend as local_backend
from mpilaunch.backends.local.backend import LocalBackend
from mpilaunch.core import mpi
from mpilaunch.core.mpi.base import MpiInfo
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from mpilaunch.workloads.mpirun import MpirunWorkload

OMPI5 = MpiInfo("openmpi", "5.0.11", "/venv/bin/mpirun")
OMPI4 = MpiInfo("openmpi", "4.1.4", "/usr/bin/mpirun.openmpi")
MPICH = MpiInfo("mpich", "4.0", "/usr/bin/mpiexec.hydra")
INTEL = MpiInfo("intel", "2021.18", "/opt/impi/bin/mpiexec.hydra")


def plan_of(workers: int, slots: int = 2) -> Plan:
    return Plan("hn", tuple(WorkerPlan(f"hn-worker-{i}", slots, 0) for i in range(workers)))


@pytest.mark.parametrize(
    "info,needs",
    [(OMPI5, True), (OMPI4, False), (MPICH, False), (INTEL, False)],
    ids=["ompi5", "ompi4", "mpich", "intel"],
)
def test_only_open_mpi_5_needs_a_host_name_per_worker(info, needs):
    assert mpi.for_name(info.flavour).needs_own_hostnames(info) is needs


@pytest.mark.parametrize(
    "info,workers,asked",
    [(OMPI5, 2, True), (OMPI5, 1, False), (OMPI4, 2, False), (MPICH, 2, False)],
    ids=["ompi5-2-workers", "ompi5-1-worker", "ompi4", "mpich"],
)
def test_the_mpirun_workload_asks_for_them_before_allocate(tmp_path, info, workers, asked):
    plan = plan_of(workers)
    spec = JobSpec(command=("true",), name="hn", np=plan.ranks)
    backend = LocalBackend(spec, plan, tmp_path)
    MpirunWorkload(spec, "hn", plan, info).bind(backend, tmp_path, dict(os.environ))
    assert backend.own_hostnames is asked


def local_backend_asked(tmp_path, workers: int = 2) -> LocalBackend:
    plan = plan_of(workers)
    backend = LocalBackend(JobSpec(command=("true",), name="hn", np=plan.ranks), plan, tmp_path)
    backend.own_hostnames = True
    return backend


def test_each_agent_gets_its_workers_name_where_the_machine_allows_it(tmp_path, monkeypatch, capsys):
    tried = []
    monkeypatch.setattr(local_backend, "can_take_hostname", lambda name: tried.append(name))
    backend = local_backend_asked(tmp_path)
    assert backend._can_take_hostnames() is True
    assert tried == ["hn-worker-0"]  # once, with the longest name
    backend.take_hostnames = True
    for worker in backend.plan.workers:
        argv = backend._agent_argv(worker, 3)
        assert argv[argv.index("--hostname") :][:2] == ["--hostname", worker.name]
        assert agent_cli.build_parser().parse_args(argv[1:]).hostname == worker.name
    assert capsys.readouterr().err == ""


def test_no_hostname_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(local_backend, "can_take_hostname", lambda name: pytest.fail("tried without being asked"))
    plan = plan_of(2)
    backend = LocalBackend(JobSpec(command=("true",), name="hn", np=plan.ranks), plan, tmp_path)
    assert backend._can_take_hostnames() is False
    assert "--hostname" not in backend._agent_argv(plan.workers[0], 3)


def test_a_machine_that_refuses_gets_a_warning_and_the_job_runs_as_before(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(local_backend, "can_take_hostname", lambda name: "Operation not permitted")
    backend = local_backend_asked(tmp_path)
    assert backend._can_take_hostnames() is False
    assert "--hostname" not in backend._agent_argv(backend.plan.workers[0], 3)
    warning, hint = capsys.readouterr().err.splitlines()
    assert warning.startswith("mpilaunch: warning: this MPI takes the 2 local workers")
    assert "MPI_COMM_TYPE_SHARED" in warning and warning.endswith(": Operation not permitted")
    assert hint.startswith("  hint: run mpilaunch as root or where users may make user namespaces")


def test_a_host_name_longer_than_linux_allows_is_refused_before_anything_changes():
    with pytest.raises(OSError) as raised:
        hostname.take_hostname("x" * (hostname.HOST_NAME_MAX + 1))
    assert "longer than a host name may be" in str(raised.value)


def test_the_workers_own_hosts_file_adds_its_name_to_the_machines():
    """Programs look their own host name up (Horovod's Gloo controller binds to its address): the
    agent's mount namespace gets the machine's /etc/hosts plus the worker's name on loopback."""
    machine = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"
    assert hostname.hosts_text(machine, "hn-worker-1") == machine + "127.0.1.1\thn-worker-1\n"
    assert hostname.hosts_text("127.0.0.1 localhost", "w") == "127.0.0.1 localhost\n127.0.1.1\tw\n"
    assert hostname.hosts_text("", "w") == "127.0.1.1\tw\n"
