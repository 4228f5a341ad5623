"""Intel MPI (impi-rt from PyPI) as a real flavour on the local backend.

mpilaunch finds Intel's hydra by itself, starts its proxies through
``mpilaunch-rsh`` (I_MPI_HYDRA_BOOTSTRAP=rsh) and gives every rank the
installation's ``lib`` directory: nothing here passes ``-x`` or sets
LD_LIBRARY_PATH. The flavour-parametrized tests (test_local_mpi.py,
test_verify.py) run under Intel MPI too, as ``[intel]``.
"""

import json
import os
import sys

import pytest

from support.helpers import REPO, assert_intel_allreduce_placed, leftover_processes, mpilaunch_env, run_mpilaunch

pytestmark = pytest.mark.mpi

LIBMPI_PROBE = (
    "import ctypes, os; ctypes.CDLL('libmpi.so.12'); "
    "print('LIBMPI', os.environ['PMI_RANK'], os.environ['LD_LIBRARY_PATH'].split(':')[0], flush=True)"
)


def intel_first_on_path(intel, **extra):
    """The suite's environment with Intel's bin directory first: `mpirun` there is Intel's wrapper script."""
    env = mpilaunch_env(intel, **extra)
    env["PATH"] = os.pathsep.join([os.path.dirname(intel.mpirun), env["PATH"]])
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("I_MPI_ROOT", None)
    return env


def test_intel_detected_from_mpirun_version_and_ranks_find_libmpi(intel, tmp_path):
    """No --mpi, no --mpirun: `mpirun --version` says Intel; ranks load libmpi.so.12 by name."""
    import subprocess

    env = intel_first_on_path(intel)
    dry = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--dry-run", "--np", "4", "--slots-per-worker", "2", "--", "true"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "mpi: intel 20" in dry.stdout and f"({intel.mpirun})" in dry.stdout  # the wrapper's mpiexec.hydra
    assert "-bootstrap rsh -bootstrap-exec" in dry.stdout
    assert "I_MPI_HYDRA_BOOTSTRAP=rsh" in dry.stdout
    name = "intel-auto"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "-q",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--",
            sys.executable,
            "-c",
            LIBMPI_PROBE,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(intel.mpirun))), "lib")
    lines = sorted(line.split("LIBMPI ", 1)[1].split() for line in proc.stdout.splitlines() if "LIBMPI " in line)
    assert lines == [[str(r), libdir] for r in range(4)], proc.stdout
    assert leftover_processes(name) == []


def test_intel_mpi4py_allreduce_under_mpi_intel(intel, tmp_path):
    """`--mpi intel` finds Intel's hydra behind any other on PATH; mpi4py runs on Intel's library."""
    name = "intel-allreduce"
    env = mpilaunch_env(intel)
    env["PATH"] = os.pathsep.join([env["PATH"], os.path.dirname(intel.mpirun)])  # last on PATH
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--mpi",
            "intel",
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "tests/programs/placement.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_intel_allreduce_placed(name, proc.stdout)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["placement"]["verified"] is True
    assert leftover_processes(name) == []


def test_intel_failing_rank_is_named_and_nothing_is_left_behind(intel, tmp_path):
    name = "intel-fail"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        intel,
        env_extra={"FAIL_RANK": "2", "FAIL_CODE": "9"},
    )
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert f"mpilaunch: error: rank 2 on worker {name}-worker-1 exited with code 9" in proc.stderr
    assert "rank 2 about to fail" in proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ranks"][2]["exit_code"] == 9
    assert leftover_processes(name) == []


def test_intel_one_slot_workers_get_one_rank_each(intel):
    """Intel's hydra fills a host with as many ranks as the launching machine
    has cores unless it reads ``host:n`` from a machinefile (-f does not):
    2 ranks on 2 one-slot workers must land one per worker."""
    name = "intel-one-slot"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-q",
            "--",
            sys.executable,
            "tests/programs/placement.py",
        ],
        intel,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = sorted(
        (json.loads(line[line.find("{") :]) for line in proc.stdout.splitlines() if '"rank"' in line),
        key=lambda r: r["rank"],
    )
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0", f"{name}-worker-1"]
    assert leftover_processes(name) == []


def test_intel_large_allreduce_between_workers(intel):
    """8 MiB allreduces between two workers sharing this machine (shm names, fabric selection)."""
    program = (
        "from array import array; from mpi4py import MPI; c = MPI.COMM_WORLD; n = 1 << 20; "
        "s = array('d', [c.rank + 1.0]) * n; r = array('d', bytes(8 * n)); "
        "c.Allreduce(s, r, op=MPI.SUM); assert r[0] == r[-1] == c.size * (c.size + 1) / 2; "
        "print('BIG OK', c.rank, flush=True)"
    )
    proc = run_mpilaunch(
        ["--name", "intel-big", "-q", "--np", "4", "--slots-per-worker", "2", "--", sys.executable, "-c", program],
        intel,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("BIG OK") == 4
    assert leftover_processes("intel-big") == []
