"""torch.distributed's env:// rendezvous from mpilaunch's rank wrapper, with real torch.

Every rank runs tests/programs/torch_allreduce.py under Debian's
/usr/bin/python3 with python3-torch (1.13, CPU, gloo; scripts/test installs
it): ``init_process_group("gloo", init_method="env://")`` with nothing but
the variables the wrapper gave it (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT), then an allreduce of
the ranks. Each test checks every rank's values against the plan: ``--np 4
--slots-per-worker 2`` puts rank r on worker r // 2 as local rank r % 2.

With MPILAUNCH_REQUIRE_ALL=1 (scripts/test) a missing torch fails the tests
instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_HUNG
from support.helpers import REPO, leftover_processes, mpilaunch_env, run_to_end
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects
from support.mpi_installs import checked, installs, require
from support.yarn import describe_app
from testbeds.ports import free_port

# Debian's python3 with python3-torch here; another machine names its own (the GPU machine's venv).
TORCH_PYTHON = os.environ.get("MPILAUNCH_TEST_TORCH_PYTHON", "/usr/bin/python3")
PROGRAM = str(REPO / "tests" / "programs" / "torch_allreduce.py")
NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="session")
def torch_python() -> str:
    """Debian's python3 with python3-torch, checked: torch.distributed built with gloo."""
    probe = [TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        require(f"{TORCH_PYTHON} cannot check torch.distributed: {e} (apt-get install python3-torch)")
    if done.returncode != 0:
        require(
            f"{TORCH_PYTHON} has no torch.distributed with gloo (apt-get install python3-torch): "
            f"{done.stderr.strip()[-300:]}"
        )
    return TORCH_PYTHON


@pytest.fixture
def openmpi4():
    """Debian's Open MPI 4.1: the rank program uses no MPI, so the simplest mpirun will do."""
    return checked(installs()["openmpi4"])


def torch_ranks(stdout: str) -> list[dict]:
    """The TORCHENV lines of a job's output (mpilaunch echoes them as ``[r] TORCHENV {...}``)."""
    out = [json.loads(line.split("TORCHENV ", 1)[1]) for line in stdout.splitlines() if "TORCHENV " in line]
    return sorted(out, key=lambda r: r["rank"])


def assert_planned(
    ranks: list[dict], name: str, addr: str | None = None, port: str | None = None, slots: tuple[int, ...] = (2, 2)
) -> None:
    """Ranks filling the workers' ``slots`` in order: each one's variables and what torch made of
    them match the plan; all ranks met at one MASTER_ADDR:MASTER_PORT (``addr``/``port`` when given)."""
    size = sum(slots)
    placed = [(node, local) for node, n in enumerate(slots) for local in range(n)]  # rank -> (worker, local rank)
    assert [r["rank"] for r in ranks] == list(range(size)), ranks
    for r in ranks:
        i = r["rank"]
        node, local = placed[i]
        env = r["env"]
        assert {k: env[k] for k in NAMES[:5]} == {
            "RANK": str(i),
            "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(slots[node]),
            "NODE_RANK": str(node),
        }, r
        assert r["worker"] == f"{name}-worker-{node}", r
        assert (r["size"], r["sum"], r["backend"]) == (size, size * (size - 1) / 2, "gloo"), r
    masters = {(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in ranks}
    assert len(masters) == 1, masters
    ((master_addr, master_port),) = masters
    assert master_addr and master_port and master_port.isdigit() and 0 < int(master_port) < 65536, masters
    if addr is not None:
        assert master_addr == addr, masters
    if port is not None:
        assert master_port == port, masters


def run_local(name: str, install, extra_args=(), np: int = 4, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--mpirun",
        install.mpirun,
        "--name",
        name,
        "--np",
        str(np),
        "--slots-per-worker",
        "2",
        "-q",
        *extra_args,
        "--",
        TORCH_PYTHON,
        PROGRAM,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=mpilaunch_env(install))


# ------------------------------------------------------------------ local backend


@pytest.mark.mpi
def test_torch_env_local_gloo_allreduce_4_ranks_on_2_workers(torch_python, openmpi4, tmp_path):
    """The local backend: MASTER_ADDR is loopback, MASTER_PORT a port mpilaunch found free."""
    name = "torch-env-local"
    proc = run_local(name, openmpi4, ["--output-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = torch_ranks(proc.stdout)
    assert_planned(ranks, name, addr="127.0.0.1")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert leftover_processes(name) == []


@pytest.mark.mpi
def test_torch_env_user_set_master_addr_and_port_are_kept(torch_python, openmpi4):
    """``-x MASTER_ADDR=... -x MASTER_PORT=...`` win over mpilaunch's own choice; the rest is still set."""
    name = "torch-env-user"
    port = str(free_port())
    proc = run_local(name, openmpi4, ["-x", "MASTER_ADDR=localhost", "-x", f"MASTER_PORT={port}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_planned(torch_ranks(proc.stdout), name, addr="localhost", port=port)


@pytest.mark.mpi
def test_torch_env_uneven_workers_local_world_size_from_the_plan_under_openmpi5(torch_python, openmpi5):
    """``--np 3`` on 2-slot workers: 2 ranks on worker 0, 1 on worker 1. Open MPI 5.0 gives every
    rank OMPI_COMM_WORLD_LOCAL_SIZE=1 there; LOCAL_WORLD_SIZE must still be 2, 2, 1."""
    name = "torch-env-uneven"
    proc = run_local(name, openmpi5, np=3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_planned(torch_ranks(proc.stdout), name, addr="127.0.0.1", slots=(2, 1))


# ------------------------------------------------------------------ hang diagnosis (issue 42)

HANG_PROGRAM = REPO / "tests" / "programs" / "hang_torch.py"
# the lines hang_torch.py marks "# STUCK: <where>"
HANG_STUCK = {
    m[1]: i
    for i, line in enumerate(HANG_PROGRAM.read_text().splitlines(), 1)
    if (m := re.search(r"STUCK: (\S+)", line))
}


@pytest.mark.mpi
@pytest.mark.parametrize("odd", [0, 1, 2, 3])
def test_torch_env_hang_gloo_rank_sleeping_before_all_reduce_is_named(torch_python, openmpi4, tmp_path, odd):
    """One rank sleeps while the others wait in gloo's all_reduce (rank 0 included: it serves the
    TCP store): --stall-timeout names that rank, its worker and its line, and stops with EXIT_HUNG."""
    name = f"torch-hang-{odd}"
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--mpirun",
        openmpi4.mpirun,
        "--name",
        name,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "--output-dir",
        str(tmp_path),
        "--stall-timeout",
        "6",
        "--timeout",
        "150",
        "--",
        TORCH_PYTHON,
        str(HANG_PROGRAM),
        str(odd),
    ]
    proc = run_to_end(cmd, 240, cwd=REPO, env=mpilaunch_env(openmpi4))
    assert proc.returncode == EXIT_HUNG, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: hang:")]
    assert lines == [
        f"mpilaunch: hang: rank {odd} ({name}-worker-{odd // 2}) is in time.sleep at "
        f"hang_torch.py:{HANG_STUCK['sleep']}; the 3 other ranks are in all_reduce at "
        f"hang_torch.py:{HANG_STUCK['others']}"
    ], proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == EXIT_HUNG and report["hang"]["odd_ranks"] == [odd], report.get("hang")
    assert [s["rank"] for s in report["stacks"]] == [0, 1, 2, 3]
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ YARN


@pytest.mark.yarn
@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_torch_env_yarn_gloo_allreduce_4_ranks_in_2_containers(torch_python, yarn, openmpi_env, tmp_path, launcher):
    """The YARN backend, mpirun here or in the launcher container: MASTER_ADDR is worker 0's
    container host and MASTER_PORT a port its exec agent found free there."""
    name = f"torch-env-yarn-{launcher}"
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "yarn",
        "--mpirun",
        openmpi_env["mpirun"],
        "--name",
        name,
        "--launcher",
        launcher,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "--memory",
        "1024 MiB",
        "--vcores",
        "1",
        "--output-dir",
        str(tmp_path),
        "-q",
        "--",
        TORCH_PYTHON,
        PROGRAM,
    ]
    proc = run_to_end(cmd, 240, lambda: describe_app(yarn, name), cwd=REPO, env=openmpi_env["env"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = torch_ranks(proc.stdout)
    assert_planned(ranks, name)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    # MASTER_ADDR: the host of worker 0's exec agent (its container's NodeManager host, all
    # containers reach it); MASTER_PORT: not the agent's own port (a free one found there)
    agent_host, _, agent_port = report["workers"][f"{name}-worker-0"]["address"].rpartition(":")
    assert ranks[0]["env"]["MASTER_ADDR"] == agent_host, (ranks[0]["env"], report["workers"])
    assert ranks[0]["env"]["MASTER_PORT"] != agent_port


# ------------------------------------------------------------------ Kubernetes (kwok)


@pytest.mark.k8s
def test_torch_env_k8s_pods_get_worker_0s_name_and_port_29500(torch_python, kube, k8s_env, tmp_path):
    """The Kubernetes backend: MASTER_ADDR is worker 0's ``<pod>.<job>`` name (its headless
    Service) and MASTER_PORT torchrun's 29500, free in a pod's own network namespace.

    kwok's pods are local processes sharing this machine's network, where neither
    holds: the program records the values it was given, then connects to
    TORCH_TEST_CONNECT_ADDR/PORT (loopback and a free port) instead."""

    job = "torch-env-k8s"
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mpilaunch",
                "--backend",
                "k8s",
                "--image",
                "mpilaunch:test",
                "--name",
                job,
                "--launcher",
                "local",
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "-q",
                "-x",
                "TORCH_TEST_CONNECT_ADDR=127.0.0.1",
                "-x",
                f"TORCH_TEST_CONNECT_PORT={free_port()}",
                "--",
                TORCH_PYTHON,
                PROGRAM,
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
            env=k8s_env,
        )
    finally:
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_planned(torch_ranks(proc.stdout), job, addr=f"{job}-worker-0.{job}", port="29500")
    assert leftover_objects(kube, job) == []
