"""The peer on the real node: Kubeflow's mpi-operator (marker ``real_pods``).

``testbeds/k8s/mpi_operator.py`` runs the operator's controller (v0.8.2, built
from its Go module source) next to the control plane; the MPIJob's pods run
``foreign-mpiop`` (Debian's Open MPI 4.1, sshd for mpiuser on port 2222, the
rank program benchmarks/bench_vs_mpi_operator.py runs through both systems).
This test keeps the peer from rotting between benchmark runs.

The controller's cold build took 10 minutes (3.8 min of CPU) on this busy 2-core
machine, more than a suite run can spend on a peer: the suite runs this test only where
``python -m testbeds.k8s.mpi_operator build`` (or the benchmark) built it, and
skips it, saying so, where it is not built.
"""

from __future__ import annotations

import time

import pytest

from support.real_pods import ranks_from
from testbeds.k8s import mpi_operator as mo

# a skip mark, decided before any fixture: no testbed is started only to skip; and a skip, not
# require(): scripts/test (MPILAUNCH_REQUIRE_ALL=1) does not build the peer
pytestmark = [
    pytest.mark.real_pods,
    pytest.mark.skipif(
        not mo.built(),
        reason=f"mpi-operator {mo.VERSION} not built (~10 min on 2 cores, not part of a suite run): "
        "python -m testbeds.k8s.mpi_operator build, or benchmarks/bench_vs_mpi_operator.py",
    ),
]


@pytest.fixture(scope="module")
def operator(real):
    op = mo.MpiOperator(real.cluster).start()
    yield op
    op.stop()


def test_mpi_operator_runs_a_4_rank_mpijob_on_2_workers(real, foreign, operator):
    """A 4-rank MPIJob, 2 workers x 2 slots: it succeeds, the launcher's log has one line of
    every rank, each pair on its own worker pod, and the operator removes the workers."""
    image = foreign("mpiop")
    name = "mpiop-smoke"
    c = real.cluster
    c.kubectl("delete", "mpijob", name, "--ignore-not-found", "--wait=true", check=False)
    job = mo.mpijob(name, image, 2, 2, ["python3", mo.PROGRAM], placement=mo.real_node_placement())
    c.apply(job)
    try:
        c.wait(lambda: mo.job_state(c, name) in ("Succeeded", "Failed"), 180, f"MPIJob {name} finished", interval=0.5)
        selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
        logs = c.kubectl("logs", "--tail=-1", "-l", selector)
        state = mo.job_state(c, name)
        assert state == "Succeeded", (state, logs.stdout[-2000:], c.log_tail(mo.COMPONENT))
        ranks = ranks_from(logs.stdout)
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3], logs.stdout[-2000:]
        assert all(r["size"] == 4 and r["sum"] == 10 for r in ranks), ranks
        assert [r["hostname"] for r in ranks] == [f"{name}-worker-{i // 2}" for i in range(4)], ranks
        assert all(r["library"].startswith("Open MPI v4.1") for r in ranks), ranks[0]["library"]
        # cleanPodPolicy Running: the workers go once the launcher is done
        c.wait(lambda: not mo.job_pods(c, name, "worker"), 60, "the MPIJob's workers released", interval=0.5)
    finally:
        t0 = time.monotonic()
        c.kubectl("delete", "mpijob", name, "--wait=true", check=False, timeout=120)
        assert time.monotonic() - t0 < 120
