"""Real Horovod (0.28.1, PyTorch, CPU) through mpilaunch: the local backend and YARN.

scripts/build-horovod.sh builds Horovod with MPI and Gloo against Debian's
python3-torch and Open MPI 4.1 and caches it under
``$MPILAUNCH_CACHE/mpilaunch-horovod/openmpi`` (``venv/bin/python`` runs the
ranks, ``wheel/`` holds the wheel; MPILAUNCH_HOROVOD_DIR names another build). Every rank runs
tests/programs/horovod_allreduce.py: hvd.init(), an allreduce, a broadcast
and an allgather, then one training step (hvd.broadcast_parameters,
hvd.DistributedOptimizer over SGD, each rank its own batch; afterwards the
parameters are identical on every rank, and moved by the averaged gradient);
each test checks Horovod's own view of every rank (rank,
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

from mpilaunch.core.exit_codes import EXIT_HUNG
from support.helpers import REPO, leftover_processes, mpilaunch_env, run_to_end
from support.horovod_builds import HOROVOD, HorovodBuild, assert_horovod_view, checked_build
from support.horovod_builds import horovod_build as build_of
from support.horovod_builds import openmpi4_mpirun as openmpi4_mpirun_path
from support.mpi_installs import require
from support.yarn import describe_app

PROGRAM = str(REPO / "tests" / "programs" / "horovod_allreduce.py")


@pytest.fixture(scope="session")
def horovod() -> Path:
    """The Open MPI 4.1 build (the one the YARN tests and the Kubernetes image use)."""
    return checked_build(HOROVOD)


@pytest.fixture
def openmpi4_mpirun() -> str:
    return openmpi4_mpirun_path()


@pytest.fixture(params=["openmpi4", "openmpi5"])
def horovod_build(request) -> HorovodBuild:
    """Each Horovod build with the MPI it was built against: Debian's Open MPI 4.1, or PyPI's
    Open MPI 5 (the suite's `mpi` extra) installed in the build's own venv, whose mpirun runs it."""
    return build_of(request.param)


def horovod_ranks(stdout: str) -> list[dict]:
    """The HOROVOD lines of a job's output (mpilaunch echoes them as ``[r] HOROVOD {...}``)."""
    out = [json.loads(line.split("HOROVOD ", 1)[1]) for line in stdout.splitlines() if "HOROVOD {" in line]
    return sorted(out, key=lambda r: r["rank"])


def assert_planned(
    ranks: list[dict], name: str, controller: str, workers: int = 2, slots: int = 2, libdir: Path | None = None
) -> None:
    """Horovod's view of each rank is the plan's, and so are the wrapper's variables; collectives right.
    ``libdir``: where the libmpi every rank loaded must lie (Debian's 4.1 and PyPI's 5 are both
    libmpi.so.40, so a build finding the other one would load it without a word)."""
    size = workers * slots
    assert [r["rank"] for r in ranks] == list(range(size)), ranks
    for r in ranks:
        if libdir is not None:
            assert Path(r["libmpi"]).resolve().parent == libdir, (r["libmpi"], libdir)
        i = r["rank"]
        node, local = divmod(i, slots)
        assert_horovod_view(r, workers, slots)
        assert r["worker"] == f"{name}-worker-{node}", r
        assert {k: r["env"][k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")} == {
            "RANK": str(i),
            "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(local),
            "NODE_RANK": str(node),
        }, r
        assert r["controller"] == controller, r
        assert (r["sum"], r["broadcast"], r["allgather"]) == (size * (size - 1) / 2, 100.0, list(range(size))), r
        assert r["version"] == "0.28.1", r
        # the training step: rank 0's parameters everywhere, one step of the averaged gradient, still
        # identical on every rank afterwards, and moved
        train = r["train"]
        assert {k: train[k] for k in ("broadcast", "identical", "moved", "averaged", "params")} == {
            "broadcast": True,
            "identical": True,
            "moved": True,
            "averaged": True,
            "params": 10,
        }, r
    # each rank's loss is of its own batch: the data really differed between ranks
    assert len({r["train"]["loss"] for r in ranks}) == size, [r["train"] for r in ranks]


def mpilaunch(
    backend_args: list[str],
    name: str,
    horovod: Path,
    mpirun: str,
    env: dict,
    program_args=(),
    timeout: float = 240,
    context=None,
) -> subprocess.CompletedProcess:
    """The job to its end; past ``timeout``, SIGTERM, and ``context()`` in the failure (``finish``)."""
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        *backend_args,
        "--mpirun",
        mpirun,
        "--name",
        name,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "-q",
        "--",
        str(horovod / "venv" / "bin" / "python"),
        PROGRAM,
        *program_args,
    ]
    return run_to_end(cmd, timeout, context, cwd=REPO, env=env)


# ------------------------------------------------------------------ the build


def test_horovod_check_build_lists_tensorflow_pytorch_and_the_mpi_and_gloo_controllers(horovod_build):
    done = subprocess.run(
        [str(horovod_build.dir / "venv" / "bin" / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sections = dict(re.findall(r"Available ([A-Za-z ]+):\n((?:\s*\[.\] .*\n?)+)", done.stdout))
    ticked = {name: set(re.findall(r"\[X\] (\S+)", body)) for name, body in sections.items()}
    assert ticked == {
        "Frameworks": {"TensorFlow", "PyTorch"},
        "Controllers": {"MPI", "Gloo"},
        "Tensor Operations": {"MPI", "Gloo"},
    }, done.stdout
    assert "Horovod v0.28.1" in done.stdout


def test_horovod_wheel_is_cached_for_an_image_build(horovod):
    """The wheel an image build installs sits next to the venv, and is the one the venv runs."""
    wheels = sorted((horovod / "wheel").glob("horovod-0.28.1-*.whl"))
    assert len(wheels) == 1, wheels
    done = subprocess.run(
        [str(horovod / "venv" / "bin" / "python"), "-m", "pip", "show", "-f", "horovod"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Version: 0.28.1" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------------ local backend

# Open MPI 5 with the MPI controller hung in hvd.init() here until each local worker got a host name
# of its own under it (issue 48, docs/local.md): the ranks' MPI_COMM_TYPE_SHARED splits disagreed
# and Horovod's MPIController allgathers over that local communicator.
BUILDS_AND_CONTROLLERS = [
    ("openmpi4", "mpi"),
    ("openmpi4", "gloo"),
    ("openmpi5", "mpi"),
    ("openmpi5", "gloo"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("horovod_build,controller", BUILDS_AND_CONTROLLERS, indirect=["horovod_build"])
def test_horovod_local_4_ranks_on_2_workers(horovod_build, tmp_path, controller):
    """Under Open MPI 4.1 and 5, each with the Horovod built against it."""
    name = f"horovod-local-{horovod_build.id}-{controller}"
    proc = mpilaunch(
        ["--output-dir", str(tmp_path)],
        name,
        horovod_build.dir,
        horovod_build.mpirun,
        mpilaunch_env(),
        ["--gloo"] if controller == "gloo" else [],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_planned(horovod_ranks(proc.stdout), name, controller, libdir=horovod_build.libdir)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert leftover_processes(name) == []


# The MPI controller's case under Open MPI 4.1 is tests/e2e/test_tf_horovod.py's (TensorFlow). Under
# Open MPI 5 it is left out: the other ranks' MPI_ERRORS_ARE_FATAL abort (exit 14) races rank 1's own
# exit to mpilaunch, which credits whichever status arrives first (2 runs in 20 under load).
@pytest.mark.mpi
@pytest.mark.parametrize(
    "horovod_build,controller", [("openmpi4", "gloo"), ("openmpi5", "gloo")], indirect=["horovod_build"]
)
def test_horovod_rank_failing_inside_the_job_is_named(horovod_build, tmp_path, controller):
    """Rank 1 exits with 43 after hvd.init() and the first allreduce, while the others wait in the
    next collective: mpilaunch exits with 43, names rank 1 and its worker, and leaves nothing."""
    name = f"horovod-fail-{horovod_build.id}-{controller}"
    env = mpilaunch_env() | {"HVD_FAIL_RANK": "1", "HVD_FAIL_CODE": "43"}
    proc = mpilaunch(
        ["--output-dir", str(tmp_path), "-x", "HVD_FAIL_RANK", "-x", "HVD_FAIL_CODE"],
        name,
        horovod_build.dir,
        horovod_build.mpirun,
        env,
        ["--gloo"] if controller == "gloo" else [],
    )
    assert proc.returncode == 43, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"rank 1 on worker {name}-worker-0 exited with code 43" in proc.stderr, proc.stderr[-3000:]
    assert "rank 1 fails on purpose after the first collective" in proc.stderr  # its last lines
    assert horovod_ranks(proc.stdout) == []  # nobody got past the broadcast
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 43 and report["ranks"][1]["exit_code"] == 43, report["ranks"]
    assert leftover_processes(name) == []


@pytest.mark.mpi
def test_collect_files_timeline_of_a_real_horovod_job(horovod, openmpi4_mpirun, tmp_path):
    """--timeline F is horovodrun's --timeline-filename F: Horovod's rank 0 writes its trace to F in
    its worker (the ranks run in their own directory here) and F comes back under that worker."""
    name = "horovod-timeline"
    job = tmp_path / "job"
    job.mkdir()
    out = tmp_path / "out"
    env = mpilaunch_env(PYTHONPATH=str(REPO))  # the job runs in its own directory: this checkout's mpilaunch
    cmd = [sys.executable, "-m", "mpilaunch", "--mpirun", openmpi4_mpirun, "--name", name, "--np", "4"]
    cmd += ["--slots-per-worker", "2", "-q", "--output-dir", str(out), "--timeline", "hvd-timeline.json"]
    proc = run_to_end(cmd + ["--", str(horovod / "venv" / "bin" / "python"), PROGRAM], 240, cwd=job, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(horovod_ranks(proc.stdout)) == 4, proc.stdout[-3000:]
    timeline = out / "files" / f"{name}-worker-0" / "hvd-timeline.json"
    text = timeline.read_text()
    # Horovod's trace events (a JSON array it streams, and may leave unclosed at exit): its allreduce is there
    assert text.lstrip().startswith("[") and re.search(r'"name": ?"[A-Z_]*ALLREDUCE', text), text[:2000]
    assert (job / "hvd-timeline.json").read_text() == text  # the local backend's worker directory is this one
    collected = json.loads((out / "report.json").read_text())["collected"]
    assert collected["files"] == 1 and collected["bytes"] == len(text.encode()), collected
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ hang diagnosis (issue 42)

HANG_PROGRAM = REPO / "tests" / "programs" / "hang_horovod.py"
# the lines hang_horovod.py marks "# STUCK: <where>"
HANG_STUCK = {
    m[1]: i
    for i, line in enumerate(HANG_PROGRAM.read_text().splitlines(), 1)
    if (m := re.search(r"STUCK: (\S+)", line))
}


@pytest.mark.mpi
# rank 0 (Horovod's coordinator) and a rank of the other worker (0, 1, 2 and 3 until 2026-12-06:
# the four cost a minute of the suite, and 1 and 3 add no path 0 and 2 do not take)
@pytest.mark.parametrize("odd", [0, 2])
def test_horovod_hang_rank_that_skips_a_tensor_is_named(horovod, openmpi4_mpirun, tmp_path, odd):
    """One rank skips the tensor "grad_a" and waits in the allreduce of "grad_b"; the others wait for
    its "grad_a" (rank 0 included: Horovod's coordinator). --stall-timeout names that rank, its worker
    and its line, from the main thread's stacks (not Horovod's background thread), and stops the job
    with EXIT_HUNG."""
    name = f"horovod-hang-{odd}"
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--mpirun",
        openmpi4_mpirun,
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
        str(horovod / "venv" / "bin" / "python"),
        str(HANG_PROGRAM),
        str(odd),
    ]
    proc = run_to_end(cmd, 240, cwd=REPO, env=mpilaunch_env())
    assert proc.returncode == EXIT_HUNG, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: hang:")]
    assert lines == [
        f"mpilaunch: hang: rank {odd} ({name}-worker-{odd // 2}) is in synchronize via hvd.allreduce "
        f"at hang_horovod.py:{HANG_STUCK['skipped']}; the 3 other ranks are in synchronize via "
        f"hvd.allreduce at hang_horovod.py:{HANG_STUCK['others']}"
    ], proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == EXIT_HUNG and report["hang"]["odd_ranks"] == [odd], report.get("hang")
    assert [s["rank"] for s in report["stacks"]] == [0, 1, 2, 3]
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ YARN


@pytest.mark.yarn
# The MPI controller on YARN, under both launchers, is tests/e2e/test_tf_horovod.py's (TensorFlow)
@pytest.mark.parametrize("launcher,controller", [("cluster", "gloo")])
def test_horovod_yarn_4_ranks_in_2_containers(horovod, yarn, openmpi4_mpirun, tmp_path, launcher, controller):
    """mpirun here or in the launcher container; with Gloo, rank 0 serves the rendezvous in worker 0's
    container at the host and port its exec agent gave the rank wrapper."""
    name = f"horovod-yarn-{launcher}-{controller}"
    env = mpilaunch_env(None, **yarn.env) | {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), yarn.env["PATH"]])
    }
    proc = mpilaunch(
        [
            "--backend",
            "yarn",
            "--launcher",
            launcher,
            "--memory",
            "1024 MiB",
            "--vcores",
            "1",
            "--output-dir",
            str(tmp_path),
        ],
        name,
        horovod,
        openmpi4_mpirun,
        env,
        ["--gloo"] if controller == "gloo" else [],
        context=lambda: describe_app(yarn, name),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = horovod_ranks(proc.stdout)
    assert_planned(ranks, name, controller, libdir=Path("/usr/lib/x86_64-linux-gnu"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    if controller == "gloo":
        agent_host = report["workers"][f"{name}-worker-0"]["address"].rpartition(":")[0]
        assert ranks[0]["env"]["MASTER_ADDR"] == agent_host, (ranks[0]["env"], report["workers"])


# ------------------------------------------------------------------ Kubernetes (real pods)


@pytest.mark.real_pods
# The MPI controller on real pods, under both launchers, is tests/e2e/test_tf_horovod.py's (TensorFlow,
# in the project's Horovod image); this user's own image keeps the Gloo controller's path
@pytest.mark.parametrize("launcher,controller", [("cluster", "gloo")])
def test_horovod_on_real_pods_in_a_users_horovod_image(horovod, real, openmpi4_mpirun, tmp_path, launcher, controller):
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
