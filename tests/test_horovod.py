"""Real Horovod (0.28.1, PyTorch, CPU) through mpilaunch: the local backend and YARN.

scripts/build-horovod.sh builds Horovod with MPI and Gloo against Debian's
python3-torch and Open MPI 4.1 and caches it under
``$MPILAUNCH_CACHE/mpilaunch-horovod/openmpi`` (``venv/bin/python`` runs the
ranks, ``wheel/`` holds the wheel; MPILAUNCH_HOROVOD_DIR names another build). Every rank runs
tests/programs/horovod_allreduce.py: hvd.init(), an allreduce, a broadcast
and an allgather; each test checks Horovod's own view of every rank (rank,
local rank and size, cross rank and size, the controller) against the plan:
``--np 4 --slots-per-worker 2`` puts rank r on worker r // 2 as local rank
r % 2. The ranks run under Debian's ``mpirun.openmpi``, the MPI Horovod was
built against.

Controllers: MPI (the default under mpirun), and Gloo, with mpirun as the
process launcher only and Horovod's HTTP rendezvous served by rank 0 at the
MASTER_ADDR:MASTER_PORT mpilaunch's rank wrapper chose (see the program).
Kubernetes needs Horovod inside an image: not here yet.

With MPILAUNCH_REQUIRE_ALL=1 (scripts/test) a missing build fails the tests
instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CACHE, require
from helpers import REPO, leftover_processes, mpilaunch_env

HOROVOD = Path(os.environ.get("MPILAUNCH_HOROVOD_DIR", CACHE / "mpilaunch-horovod" / "openmpi"))
PROGRAM = str(REPO / "tests" / "programs" / "horovod_allreduce.py")
MPIRUN = "/usr/bin/mpirun.openmpi"


@pytest.fixture(scope="session")
def horovod() -> Path:
    """The checked Horovod build (its .done is written only after scripts/build-horovod.sh's checks)."""
    if not (HOROVOD / ".done").is_file() or not os.access(HOROVOD / "venv" / "bin" / "python", os.X_OK):
        require(f"Horovod is not built in {HOROVOD} (run scripts/build-horovod.sh)")
    return HOROVOD


@pytest.fixture
def openmpi4_mpirun() -> str:
    if not os.access(MPIRUN, os.X_OK):
        require(f"{MPIRUN} not installed (apt-get install openmpi-bin)")
    return MPIRUN


def horovod_ranks(stdout: str) -> list[dict]:
    """The HOROVOD lines of a job's output (mpilaunch echoes them as ``[r] HOROVOD {...}``)."""
    out = [json.loads(line.split("HOROVOD ", 1)[1]) for line in stdout.splitlines() if "HOROVOD {" in line]
    return sorted(out, key=lambda r: r["rank"])


def assert_planned(ranks: list[dict], name: str, controller: str, workers: int = 2, slots: int = 2) -> None:
    """Horovod's view of each rank is the plan's, and so are the wrapper's variables; collectives right."""
    size = workers * slots
    assert [r["rank"] for r in ranks] == list(range(size)), ranks
    for r in ranks:
        i = r["rank"]
        node, local = divmod(i, slots)
        assert (r["size"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) == (
            size, local, slots, node, workers), r
        assert r["worker"] == f"{name}-worker-{node}", r
        assert {k: r["env"][k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")} == {
            "RANK": str(i), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local), "NODE_RANK": str(node)}, r
        assert r["controller"] == controller, r
        assert (r["sum"], r["broadcast"], r["allgather"]) == (size * (size - 1) / 2, 100.0, list(range(size))), r
        assert r["version"] == "0.28.1", r


def mpilaunch(backend_args: list[str], name: str, horovod: Path, mpirun: str, env: dict,
              program_args=(), timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mpilaunch", *backend_args, "--mpirun", mpirun, "--name", name,
           "--np", "4", "--slots-per-worker", "2", "-q",
           "--", str(horovod / "venv" / "bin" / "python"), PROGRAM, *program_args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


# ------------------------------------------------------------------ the build

def test_horovod_check_build_lists_pytorch_and_the_mpi_and_gloo_controllers(horovod):
    done = subprocess.run([str(horovod / "venv" / "bin" / "horovodrun"), "--check-build"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    sections = dict(re.findall(r"Available ([A-Za-z ]+):\n((?:\s*\[.\] .*\n?)+)", done.stdout))
    ticked = {name: set(re.findall(r"\[X\] (\S+)", body)) for name, body in sections.items()}
    assert ticked == {"Frameworks": {"PyTorch"}, "Controllers": {"MPI", "Gloo"},
                      "Tensor Operations": {"MPI", "Gloo"}}, done.stdout
    assert "Horovod v0.28.1" in done.stdout


def test_horovod_wheel_is_cached_for_an_image_build(horovod):
    """The wheel an image build installs sits next to the venv, and is the one the venv runs."""
    wheels = sorted((horovod / "wheel").glob("horovod-0.28.1-*.whl"))
    assert len(wheels) == 1, wheels
    done = subprocess.run([str(horovod / "venv" / "bin" / "python"), "-m", "pip", "show", "-f", "horovod"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Version: 0.28.1" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------------ local backend

@pytest.mark.mpi
@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_horovod_local_4_ranks_on_2_workers(horovod, openmpi4_mpirun, tmp_path, controller):
    name = f"horovod-local-{controller}"
    proc = mpilaunch(["--output-dir", str(tmp_path)], name, horovod, openmpi4_mpirun, mpilaunch_env(),
                     ["--gloo"] if controller == "gloo" else [])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_planned(horovod_ranks(proc.stdout), name, controller)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ YARN

@pytest.mark.yarn
@pytest.mark.parametrize("launcher,controller", [("local", "mpi"), ("cluster", "mpi"), ("cluster", "gloo")])
def test_horovod_yarn_4_ranks_in_2_containers(horovod, yarn, openmpi4_mpirun, tmp_path, launcher, controller):
    """mpirun here or in the launcher container; with Gloo, rank 0 serves the rendezvous in worker 0's
    container at the host and port its exec agent gave the rank wrapper."""
    name = f"horovod-yarn-{launcher}-{controller}"
    env = mpilaunch_env(None, **yarn.env) | {"PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                                                        yarn.env["PATH"]])}
    proc = mpilaunch(["--backend", "yarn", "--launcher", launcher, "--memory", "1024 MiB", "--vcores", "1",
                      "--output-dir", str(tmp_path)], name, horovod, openmpi4_mpirun, env,
                     ["--gloo"] if controller == "gloo" else [])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = horovod_ranks(proc.stdout)
    assert_planned(ranks, name, controller)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    if controller == "gloo":
        agent_host = report["workers"][f"{name}-worker-0"]["address"].rpartition(":")[0]
        assert ranks[0]["env"]["MASTER_ADDR"] == agent_host, (ranks[0]["env"], report["workers"])


# ------------------------------------------------------------------ Kubernetes (real pods)

@pytest.mark.real_pods
@pytest.mark.parametrize("launcher,controller", [("cluster", "mpi"), ("cluster", "gloo"), ("local", "mpi")])
def test_horovod_on_real_pods_in_a_users_horovod_image(horovod, real, openmpi4_mpirun, tmp_path, launcher,
                                                        controller):
    """A user's Horovod image (testbeds/k8s/build-foreign-images.sh horovod: Debian's torch and
    Open MPI, this build's wheel; no mpilaunch): 4 ranks in 2 pods, Horovod's view is the plan's.
    With Gloo, rank 0 serves the rendezvous at worker 0's pod name and port 29500."""
    try:
        image = real.cluster.node.foreign_image("horovod")
    except Exception as e:  # the build's own error names the cause
        require(f"the Horovod image did not build: {e}")
    name = f"horovod-k8s-{launcher}-{controller}"
    args = ["--np", "4", "--slots-per-worker", "2", "--launcher", launcher, "--output-dir", str(tmp_path), "-q"]
    if launcher == "local":
        args += ["--mpirun", openmpi4_mpirun]
    program = ["python3", "-c", Path(PROGRAM).read_text(), *(["--gloo"] if controller == "gloo" else [])]
    proc = real.run(name, *args, "--", *program, image=image, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = horovod_ranks(proc.stdout)
    assert_planned(ranks, name, controller)
    if controller == "gloo":
        assert ranks[0]["env"]["MASTER_ADDR"] == f"{name}-worker-0.{name}", ranks[0]["env"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert real.leftovers(name) == []
