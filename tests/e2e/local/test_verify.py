"""Placement verification with real MPI jobs on the local backend.

The mismatch is real, not mocked: a hostfile naming ``localhost`` makes every
flavour's mpirun fork that host's ranks itself (the name resolves here), so
they never reach the worker's agent, exactly the "every rank silently ran on
the launcher" failure verification exists for.
"""

import json
import sys

import pytest

from support.helpers import leftover_processes, run_mpilaunch

pytestmark = pytest.mark.mpi

PROGRAM = ["--", sys.executable, "-c", "import time; print('ran', flush=True); time.sleep(0.5)"]


def launcher_hostfile(tmp_path, flavour_id):
    text = (
        "localhost:2\nverif-elsewhere:2\n"
        if flavour_id in ("mpich", "intel")
        else "localhost slots=2\nverif-elsewhere slots=2\n"
    )
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_verified_placement_of_a_correct_launch_is_recorded(mpi_install, tmp_path):
    name = f"verif-ok-{mpi_install.id}"
    proc = run_mpilaunch(
        ["--name", name, "--np", "4", "--slots-per-worker", "2", "--output-dir", str(tmp_path), "-q", *PROGRAM],
        mpi_install,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mpilaunch-rank-start" not in proc.stdout + proc.stderr  # consumed, not echoed
    report = json.loads((tmp_path / "report.json").read_text())
    placed = report["placement"]
    assert placed["verified"] is True and placed["mismatch"] is None
    assert placed["workers"] == {
        f"{name}-worker-0": {"planned_slots": 2, "ranks": [0, 1]},
        f"{name}-worker-1": {"planned_slots": 2, "ranks": [2, 3]},
    }
    assert [(r["rank"], r["local_rank"], r["size"]) for r in placed["ranks"]] == [
        (0, 0, 4),
        (1, 1, 4),
        (2, 0, 4),
        (3, 1, 4),
    ]
    assert "verify_s" in report["timings"]
    assert leftover_processes(name) == []


def test_verify_fails_fast_when_ranks_land_on_the_launcher(mpi_install, tmp_path):
    name = f"verif-bad-{mpi_install.id}"
    hostfile = launcher_hostfile(tmp_path, mpi_install.id)
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--backend",
            "local",
            "--hostfile",
            hostfile,
            "--output-dir",
            str(out),
            "-q",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ],
        mpi_install,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: error:")]
    assert errors == [
        "mpilaunch: error: placement check failed: ranks 0-1 started on the launcher, "
        "not in a worker (plan: 4 ranks on 2 workers)"
    ], proc.stderr
    assert "hint: host name localhost resolves to this machine" in proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 4 and report["placement"]["verified"] is False
    assert report["placement"]["workers"]["(launcher)"]["ranks"] == [0, 1]
    assert report["timings"]["run_s"] < 30  # failed fast, not after the 60 s program
    assert leftover_processes(name) == []


def test_no_verify_skips_the_placement_check(mpi_install, tmp_path):
    name = f"noverif-{mpi_install.id}"
    hostfile = launcher_hostfile(tmp_path, mpi_install.id)
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--backend",
            "local",
            "--hostfile",
            hostfile,
            "--no-verify",
            "--output-dir",
            str(out),
            "-q",
            *PROGRAM,
        ],
        mpi_install,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the misplacement goes unnoticed, as asked
    assert proc.stdout.count("ran") == 4
    report = json.loads((out / "report.json").read_text())
    assert report["placement"]["verified"] is None
    assert "verify_s" not in report["timings"]
    assert leftover_processes(name) == []
