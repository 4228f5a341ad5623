"""A Kubernetes backend as ``mpilaunch run`` makes one, for the tests that read what it would
create (``backend.objects()``, its placement, its policies) with no cluster behind it."""

from __future__ import annotations

import os


def rendered_backend(tmp_path, *args: str, name: str = "j", mode: str = "mpi", command=("python3", "train.py")):
    """The K8sBackend of ``mpilaunch run --backend k8s --image img --name NAME ARGS -- COMMAND``:
    4 ranks on 2 workers (``mode="ps"``: 1 ps and 1 worker), its run directory under ``tmp_path``."""
    from mpilaunch.backends.k8s.backend import K8sBackend
    from mpilaunch.cli import parse_run
    from mpilaunch.workloads.mpirun import MpirunWorkload
    from mpilaunch.workloads.ps import PsWorkload

    shape = (
        ["--np", "4", "--slots-per-worker", "2"] if mode == "mpi" else ["--mode", "ps", "--ps", "1", "--workers", "1"]
    )
    spec, _ = parse_run(["--backend", "k8s", "--image", "img", "--name", name, *shape, *args, "--", *command])
    workload = (MpirunWorkload if mode == "mpi" else PsWorkload).prepare(spec, K8sBackend, name, dict(os.environ))
    rundir = tmp_path / "rundir"
    rundir.mkdir(parents=True, exist_ok=True)
    return K8sBackend(spec, workload.plan, rundir, cluster_launcher_allowed=workload.can_use_cluster_launcher)
