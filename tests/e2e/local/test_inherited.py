"""Settings inherited from the user's shell or image do not choose mpirun's launch.

An image that sets ``OMPI_MCA_plm=isolated`` (seen on an Ubuntu 24.04
image) made every Open MPI 4 launch fail ("All nodes which are allocated
for this job are already filled"), ``PRTE_MCA_plm=isolated`` every Open MPI
5 launch, and inside a Slurm allocation Open MPI took the allocation's host
list. mpilaunch leaves such variables out of the launch, names each once in
a warning, and pins the launch on mpirun's command line. The real-job tests
set them as a user's environment would and check that the ranks ran on
mpilaunch's workers (the placement check) with the warning given.
"""

from __future__ import annotations

import json
import re

import pytest

from mpilaunch.core import inherited, mpi
from support.helpers import run_mpilaunch
from support.mpi_installs import checked, installs

OMPI4 = mpi.MpiInfo("openmpi", "4.1.4", "/usr/bin/mpirun.openmpi")
OMPI5 = mpi.MpiInfo("openmpi", "5.0.11", "/venv/bin/mpirun")
MPICH = mpi.MpiInfo("mpich", "4.0.2", "/usr/bin/mpiexec.hydra")
INTEL = mpi.MpiInfo("intel", "2021.10", "/opt/intel/bin/mpiexec.hydra")

# What a Slurm allocation (salloc -N2) puts in a shell; no Slurm is needed for mpirun to read it.
SLURM = {
    "SLURM_JOBID": "4242",
    "SLURM_JOB_ID": "4242",
    "SLURM_NODELIST": "node[01-02]",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
    "SLURM_CLUSTER_NAME": "hpc",
}


def test_inherited_launch_settings_are_left_out_per_flavour():
    environ = {
        "OMPI_MCA_plm": "isolated",
        "OMPI_MCA_plm_rsh_agent": "ssh",
        "PRTE_MCA_ras": "slurm",
        "OMPI_MCA_btl_tcp_if_include": "eth0",
        "OMPI_MCA_orte_default_hostfile": "/etc/hosts.mpi",
        "HYDRA_LAUNCHER": "ssh",
        "I_MPI_HYDRA_BOOTSTRAP": "ssh",
        "I_MPI_PMI_LIBRARY": "/x.so",
        "PBS_NODEFILE": "/var/pbs/nodes",
        "LSB_HOSTS": "a b",
        "PE_HOSTFILE": "/sge/h",
        "JOB_ID": "7",
        "NCCL_DEBUG": "INFO",
        "PATH": "/usr/bin",
        **SLURM,
    }
    kept, left_out = inherited.split(environ, "openmpi")
    names = {o.name for o in left_out}
    # launch choices go; tuning (btl), NCCL and PATH stay; Hydra's are no concern of Open MPI's
    assert {
        "OMPI_MCA_plm",
        "OMPI_MCA_plm_rsh_agent",
        "PRTE_MCA_ras",
        "OMPI_MCA_orte_default_hostfile",
        "PBS_NODEFILE",
        "LSB_HOSTS",
        "PE_HOSTFILE",
        "JOB_ID",
        *SLURM,
    } == names
    assert {"OMPI_MCA_btl_tcp_if_include", "NCCL_DEBUG", "PATH", "HYDRA_LAUNCHER"} <= set(kept)
    _, hydra = inherited.split(environ, "intel")
    assert {"HYDRA_LAUNCHER", "I_MPI_HYDRA_BOOTSTRAP", "I_MPI_PMI_LIBRARY"} <= {o.name for o in hydra}
    assert "OMPI_MCA_plm" not in {o.name for o in hydra}
    lines = inherited.warnings(left_out)
    assert len(lines) == 2 and all(line.startswith("mpilaunch: warning: ignoring ") for line in lines)
    assert any("OMPI_MCA_plm=isolated" in line and "Open MPI launch settings" in line for line in lines)
    assert any("SLURM_JOBID" in line and "resource-manager" in line for line in lines)
    assert all(o.name in "".join(lines) for o in left_out)  # each one named


@pytest.mark.parametrize(
    "info,pins",
    [
        (OMPI4, ["--mca", "plm", "rsh", "--mca", "ras", mpi.RAS_EXCLUDED]),
        (OMPI5, ["--prtemca", "plm", "ssh", "--prtemca", "ras", mpi.RAS_EXCLUDED]),
        (MPICH, ["-launcher", "rsh", "-rmk", "user"]),
        (INTEL, ["-bootstrap", "rsh", "-rmk", "user"]),
    ],
)
def test_inherited_launch_is_pinned_on_the_command_line(info, pins):
    argv = mpi.build_mpirun(info, ranks=2, hosts=2, hostfile="/h", shim="/s", command=["true"], environ={}).argv
    joined = " ".join(argv)
    half = len(pins) // 2
    assert " ".join(pins[:half]) in joined and " ".join(pins[half:]) in joined


def placed_job(install, tmp_path, env_extra, ranks=4):
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--np",
            str(ranks),
            "--slots-per-worker",
            "2",
            "--output-dir",
            str(out),
            "--",
            "python",
            "-c",
            "import os; print('rank', os.environ['RANK'], 'ok')",
        ],
        install=install,
        env_extra=env_extra,
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc, report


def assert_ran_on_workers(proc, report, ranks, *named):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(line.split()[-2] for line in proc.stdout.splitlines() if line.endswith(" ok")) == [
        str(r) for r in range(ranks)
    ], proc.stdout
    assert report["placement"]["verified"] is True, report["placement"]
    assert all(len(w["ranks"]) == 2 for w in report["placement"]["workers"].values()), report["placement"]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: warning: ignoring")]
    for name in named:
        assert len(re.findall(rf"\b{name}\b", "\n".join(warnings))) == 1, proc.stderr  # named once


@pytest.mark.mpi
def test_inherited_ompi_mca_plm_isolated_open_mpi_4(tmp_path):

    install = checked(installs()["openmpi4"])
    proc, report = placed_job(
        install, tmp_path, {"OMPI_MCA_plm": "isolated", "OMPI_MCA_orte_default_hostfile": "/nonexistent/hosts"}
    )
    assert_ran_on_workers(proc, report, 4, "OMPI_MCA_plm", "OMPI_MCA_orte_default_hostfile")


@pytest.mark.mpi
def test_inherited_prte_mca_plm_isolated_open_mpi_5(openmpi5, tmp_path):
    proc, report = placed_job(openmpi5, tmp_path, {"PRTE_MCA_plm": "isolated", "OMPI_MCA_plm": "isolated"})
    assert_ran_on_workers(proc, report, 4, "PRTE_MCA_plm", "OMPI_MCA_plm")


@pytest.mark.mpi
@pytest.mark.parametrize("install_id", ["openmpi4", "openmpi5"])
def test_inherited_slurm_allocation_runs_on_mpilaunchs_workers(install_id, tmp_path):
    """Started inside a Slurm allocation (its variables set, as salloc leaves them): Open MPI's ras
    must not take the allocation's nodes; the ranks run on mpilaunch's workers."""

    install = checked(installs()[install_id])
    proc, report = placed_job(install, tmp_path, SLURM)
    assert_ran_on_workers(proc, report, 4, "SLURM_JOBID", "SLURM_NODELIST")


@pytest.mark.mpi
@pytest.mark.parametrize(
    "install_id,settings",
    [
        ("mpich", {"HYDRA_LAUNCHER": "ssh", "HYDRA_HOST_FILE": "/nonexistent/hosts", **SLURM}),
        (
            "intel",
            {"I_MPI_HYDRA_BOOTSTRAP": "ssh", "I_MPI_HYDRA_HOST_FILE": "/nonexistent/hosts", "HYDRA_LAUNCHER": "ssh"},
        ),
    ],
)
def test_inherited_hydra_settings_mpich_and_intel(install_id, settings, tmp_path):

    install = checked(installs()[install_id])
    proc, report = placed_job(install, tmp_path, settings)
    first = next(iter(settings))
    assert_ran_on_workers(proc, report, 4, first)


@pytest.mark.mpi
def test_inherited_torch_variables_of_the_shell_do_not_reach_every_rank(tmp_path):
    """A shell started by torchrun (or inside another job) has RANK, WORLD_SIZE, MASTER_PORT...:
    each rank gets its own instead, and -x NAME keeps a value the user means for all ranks."""

    install = checked(installs()["openmpi4"])
    proc = run_mpilaunch(
        [
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-x",
            "MASTER_ADDR",
            "--",
            "python",
            "-c",
            "import os; print('got', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])",
        ],
        install=install,
        env_extra={"RANK": "7", "WORLD_SIZE": "9", "MASTER_PORT": "1234", "MASTER_ADDR": "127.0.0.1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(line.split()[2:] for line in proc.stdout.splitlines() if " got " in f" {line}")
    assert [g[:3] for g in got] == [["0", "2", "127.0.0.1"], ["1", "2", "127.0.0.1"]], proc.stdout
    assert all(g[3] != "1234" for g in got) and got[0][3] == got[1][3]
    warning = next(line for line in proc.stderr.splitlines() if "torch.distributed variables" in line)
    assert "RANK=7" in warning and "MASTER_PORT=1234" in warning and "MASTER_ADDR" not in warning


def test_inherited_settings_are_named_in_the_dry_run():
    proc = run_mpilaunch(
        ["--dry-run", "--mpi", "openmpi", "--np", "2", "--", "true"],
        env_extra={"OMPI_MCA_plm": "isolated", "SLURM_JOBID": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "mpilaunch: warning: ignoring OMPI_MCA_plm=isolated" in proc.stderr
    assert "SLURM_JOBID" in proc.stderr
    listed = proc.stdout.split("left out of the environment (see the warnings):")[1].split()
    assert {"OMPI_MCA_plm", "SLURM_JOBID"} <= set(listed)
    assert "plm ssh" in proc.stdout or "plm rsh" in proc.stdout  # pinned in the printed mpirun line
