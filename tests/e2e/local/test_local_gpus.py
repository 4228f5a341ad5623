"""GPU jobs on the local backend: sizing, per-worker GPU partition, --bind-gpus.

No GPU exists on the test machines: a stand-in `nvidia-smi` on PATH reports
4 GPUs (said so here, as the project's rules ask). Everything else is real:
agents, shim, Open MPI 5, one process per rank.
"""

import re
import sys

import pytest

from support.helpers import leftover_processes, run_mpilaunch

pytestmark = pytest.mark.mpi

PRINT_DEVICES = (
    "import os; print('DEV', os.environ.get('OMPI_COMM_WORLD_RANK'), os.environ['MPILAUNCH_WORKER'], "
    "os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)"
)


def devices_by_rank(stdout):
    out = {}
    for line in stdout.splitlines():
        if "DEV " in line:
            rank, worker, devices = line.split("DEV ", 1)[1].split()
            out[int(rank)] = (worker, devices)
    return out


def run_gpu_job(openmpi5, fake_nvidia_smi, *extra):
    import os

    path = fake_nvidia_smi + os.pathsep + os.environ["PATH"]
    return run_mpilaunch(
        ["--name", "gpujob", "-q", "--gpus", "4", *extra, "--", sys.executable, "-c", PRINT_DEVICES],
        openmpi5,
        env_extra={"PATH": path},
    )


def test_gpus_per_node_discovered_and_partitioned(openmpi5, fake_nvidia_smi):
    # 4 GPUs discovered -> one worker with all 4 unless --gpus-per-node says otherwise.
    proc = run_gpu_job(openmpi5, fake_nvidia_smi, "--gpus-per-node", "2")
    assert proc.returncode == 0, proc.stderr
    ranks = devices_by_rank(proc.stdout)
    assert ranks == {
        0: ("gpujob-worker-0", "0,1"),
        1: ("gpujob-worker-0", "0,1"),
        2: ("gpujob-worker-1", "2,3"),
        3: ("gpujob-worker-1", "2,3"),
    }


def test_bind_gpus_gives_each_rank_its_own_device(openmpi5, fake_nvidia_smi):
    proc = run_gpu_job(openmpi5, fake_nvidia_smi, "--gpus-per-node", "2", "--bind-gpus")
    assert proc.returncode == 0, proc.stderr
    ranks = devices_by_rank(proc.stdout)
    assert {r: d for r, (_, d) in ranks.items()} == {0: "0", 1: "1", 2: "2", 3: "3"}


def test_more_gpus_than_the_machine_has_is_a_usage_error(openmpi5, fake_nvidia_smi):
    import os

    path = fake_nvidia_smi + os.pathsep + os.environ["PATH"]
    proc = run_mpilaunch(
        ["-q", "--gpus", "8", "--gpus-per-node", "4", "--", "true"], openmpi5, env_extra={"PATH": path}
    )
    assert proc.returncode == 2
    assert "needs 8 GPUs but this machine has 4" in proc.stderr


def test_dry_run_prints_plan_and_creates_nothing(openmpi5):
    proc = run_mpilaunch(
        [
            "--name",
            "dry",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--dry-run",
            "-x",
            "SEED=1",
            "--",
            "python",
            "train.py",
        ],
        openmpi5,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dry-worker-0 slots=2" in proc.stdout and "dry-worker-1 slots=2" in proc.stdout
    assert "PRTE_MCA_plm_ssh_agent=" in proc.stdout and "OMPI_MCA_plm_rsh_agent=" in proc.stdout
    # the value travels in mpirun's environment: argv names it, the dry run masks it
    assert " -x SEED " in proc.stdout and "SEED=1" not in proc.stdout
    assert "  SEED=<set, 1 chars>" in proc.stdout.splitlines(), proc.stdout
    # the user's command, as given, behind the rank wrapper and its own options
    assert re.search(r"mpilaunch\.rank( --[a-z-]+( \d+)?)* -- python train\.py$", proc.stdout, re.M), proc.stdout

    assert leftover_processes("dry") == []


def test_hostfile_names_the_workers(openmpi5, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("alpha slots=1\nbeta:2\n")
    proc = run_mpilaunch(
        [
            "-q",
            "--backend",
            "local",
            "--hostfile",
            str(hosts),
            "--",
            sys.executable,
            "-c",
            "import os; print('ON', os.environ['MPILAUNCH_WORKER'])",
        ],
        openmpi5,
    )
    assert proc.returncode == 0, proc.stderr
    on = sorted(line.split("ON ")[1] for line in proc.stdout.splitlines() if "ON " in line)
    assert on == ["alpha", "beta", "beta"]
