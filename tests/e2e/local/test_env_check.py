"""The environment check: each rank's program and MPI library against the plan.

The real mismatch is the classic one: an mpi4py built against MPICH, run by
Open MPI's mpirun. Without the check each rank is an MPI world of its own
(size 1) and the job "succeeds"; with it the job fails at once, exit 4,
naming the ranks, their workers and the two MPIs.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from mpilaunch.core import envcheck, mpi, rank_env, rank_lines
from support.helpers import mpilaunch_env, run_mpilaunch
from support.mpi_installs import checked, installs

E = envcheck.Expected(
    command="python3",
    program="/home/u/venv/bin/python3",
    flavour="openmpi",
    major=4,
    mpirun="/usr/bin/mpirun.openmpi",
    version="4.1.4",
    env_digest="0000abcd",
)
WORKERS = {0: "j-worker-0", 1: "j-worker-0", 2: "j-worker-1", 3: "j-worker-1"}

# What each rank prints: its world as mpi4py sees it, after the library is surely mapped.
PROGRAM = (
    "from mpi4py import MPI; import time; c = MPI.COMM_WORLD; print('world', c.rank, c.size, flush=True); time.sleep(3)"
)


@pytest.mark.parametrize(
    "path,expected",
    [
        ("/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40.30.4", ("openmpi", 4)),
        ("/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4", ("openmpi", 4)),
        ("/venv/lib/libmpi.so.40.40.11", ("openmpi", 5)),
        ("/usr/lib/x86_64-linux-gnu/libmpich.so.12.2.0", ("mpich-abi", None)),
        ("/opt/intel/lib/libmpi.so.12.0.0", ("mpich-abi", None)),
        ("/usr/lib/libmpi_cxx.so.40", None),
    ],
)
def test_env_check_tells_the_mpi_from_the_library_name(path, expected):
    assert envcheck.library_mpi(path) == expected


def test_env_check_names_ranks_running_another_program():
    programs = {0: E.program, 1: E.program, 2: "/usr/bin/python3", 3: "/usr/bin/python3"}
    m = envcheck.check(E, {r: {"program": p} for r, p in programs.items()}, WORKERS)
    assert m.kind == envcheck.PROGRAM
    assert m.message == (
        "environment check failed: ranks 2-3 on worker j-worker-1 run /usr/bin/python3 for "
        "'python3'; mpilaunch resolved it to /home/u/venv/bin/python3"
    )
    assert "-x PATH" in envcheck.hint(m, E)
    # where the workers' PATH is not known here (pods), the odd rank out is named
    unknown = envcheck.Expected(**{**E.__dict__, "program": None})
    m = envcheck.check(
        unknown,
        {
            0: {"program": "/a/python3"},
            1: {"program": "/a/python3"},
            2: {"program": "/b/python3"},
            3: {"program": "/a/python3"},
        },
        WORKERS,
    )
    assert "rank 2 on worker j-worker-1 runs /b/python3" in m.message and "other ranks run /a/python3" in m.message
    assert envcheck.check(E, {r: {"program": E.program} for r in WORKERS}, WORKERS) is None


def test_env_check_names_ranks_linking_another_mpi():
    envs = {
        0: {"program": E.program, "mpi_library": "/usr/lib/x86_64-linux-gnu/libmpich.so.12.2.0"},
        1: {"program": E.program, "mpi_library": "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"},
    }
    m = envcheck.check(E, envs, WORKERS)
    assert m.kind == envcheck.MPI_LIBRARY
    assert m.message == (
        "environment check failed: rank 0 on worker j-worker-0 loaded MPICH (or Intel MPI)'s "
        "library /usr/lib/x86_64-linux-gnu/libmpich.so.12.2.0, but mpirun is Open MPI 4.1.4 "
        "(/usr/bin/mpirun.openmpi)"
    )
    five = {0: {"mpi_library": "/venv/lib/libmpi.so.40.40.11"}}
    assert "Open MPI 5's library" in envcheck.check(E, five, WORKERS).message
    intel_under_mpich = envcheck.Expected(**{**E.__dict__, "flavour": "mpich", "major": 4})
    assert envcheck.check(intel_under_mpich, {0: {"mpi_library": "/opt/intel/lib/libmpi.so.12.0.0"}}, WORKERS) is None


def test_env_check_start_line_carries_program_and_digest():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "MPILAUNCH_WORKER": "j-worker-0",
        rank_env.FORWARDED_LIST_ENV: "NCCL_DEBUG,FOO",
        "NCCL_DEBUG": "INFO",
        "FOO": "a b",
    }
    line = rank_lines.format_start(env, "/opt/my env/bin/python3")
    assert rank_lines.parse_start("[1] " + line)[:4] == (1, 1, 2, "j-worker-0")
    program, digest = rank_lines.parse_start_env(line)
    assert program == "/opt/my env/bin/python3"
    assert digest == rank_env.digest([("NCCL_DEBUG", "INFO"), ("FOO", "a b")]) != rank_env.digest([])
    mpi_line = rank_lines.format_mpi("1", "j-worker-0", "/usr/lib/libmpi.so.40.30.4")
    assert rank_lines.parse_mpi("[1,1]<stderr>:" + mpi_line) == (1, "/usr/lib/libmpi.so.40.30.4")


@pytest.mark.mpi
def test_env_check_report_records_each_ranks_environment(tmp_path):
    """A matching job: report.json's environment names each rank's program and the Open MPI 4.1
    library it loaded, and the forwarded variables arrived unchanged."""

    install = checked(installs()["openmpi4"])
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--output-dir",
            str(out),
            "-x",
            "SEED=7",
            "--",
            "python",
            "-c",
            PROGRAM,
        ],
        install=install,
        env_extra={"NCCL_DEBUG": "WARN"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = json.loads((out / "report.json").read_text())["environment"]
    assert env["verified"] is True and env["env_digest_differs"] == []
    sent = mpilaunch_env(install, NCCL_DEBUG="WARN")  # what the job's shell had
    names = mpi.forwarded_names(sent, ("SEED=7",))
    values = mpi.resolve_env(names, ("SEED=7",), sent)
    assert {"NCCL_DEBUG", "PYTHONPATH", "SEED"} <= set(values)
    assert env["expected"]["env_digest"] == rank_env.digest((n, values[n]) for n in names if n in values)
    assert [r["rank"] for r in env["ranks"]] == [0, 1]
    for r in env["ranks"]:
        assert r["program"] == env["expected"]["program"] and r["program"].endswith("/python")
        assert envcheck.library_mpi(r["mpi_library"]) == ("openmpi", 4), r
        assert r["env_digest"] == env["expected"]["env_digest"]


@pytest.mark.mpi
def test_env_check_mpich_program_under_open_mpi_fails_fast(tmp_path):
    """mpi4py built against MPICH, started by Open MPI 4.1's mpirun: exit 4 with the difference named."""

    openmpi4, mpich = (checked(installs()[i]) for i in ("openmpi4", "mpich"))
    out = tmp_path / "out"
    proc = run_mpilaunch(
        [
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--output-dir",
            str(out),
            "--",
            "python",
            "-c",
            PROGRAM.replace("time.sleep(3)", "time.sleep(60)"),
        ],
        install=openmpi4,
        env_extra={"PYTHONPATH": mpich.pythonpath},
        timeout=120,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    summary = next(line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: error:"))
    assert "environment check failed: rank" in summary and "MPICH (or Intel MPI)'s library" in summary, summary
    assert "but mpirun is Open MPI 4.1" in summary and "-worker-" in summary
    assert "rebuild it against this MPI" in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["environment"]["mismatch"]["kind"] == envcheck.MPI_LIBRARY
    assert report["placement"]["verified"] is True  # placed right: only the MPI differs
    assert report["timings"]["run_s"] < 30  # stopped, not left to its 60 s sleep

    # --no-verify: the user's call; the singletons run to their end
    proc = run_mpilaunch(
        [
            "--no-verify",
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--",
            "python",
            "-c",
            PROGRAM.replace("time.sleep(3)", "pass"),
        ],
        install=openmpi4,
        env_extra={"PYTHONPATH": mpich.pythonpath},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("world 0 1") == 2  # each rank an MPI world of its own: what the check catches


# What a rank's program saw of LD_LIBRARY_PATH, one line per rank.
PRINT_LD_LIBRARY_PATH = (
    "import os; print('LDLP', os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')), "
    "os.environ.get('LD_LIBRARY_PATH'), flush=True)"
)


def seen_ld_library_path(stdout: str) -> dict[int, str]:
    return {
        int(rank): value
        for rank, value in (line.split("LDLP ", 1)[1].split() for line in stdout.splitlines() if "LDLP " in line)
    }


@pytest.mark.mpi
def test_env_check_intel_sends_ld_library_path_once_and_does_not_warn(intel, tmp_path):
    """Intel MPI (impi-rt) with -x LD_LIBRARY_PATH=$VENV/lib, its own library directory: every rank
    sees it once (the rank wrapper put it first a second time: issue 42), and nothing is reported.
    Another directory sent gets the library directory put ahead, which is mpilaunch's doing, not a
    mismatch."""
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(intel.mpirun))), "lib")
    for sent, expected in ((libdir, libdir), ("/opt/elsewhere/lib", f"{libdir}:/opt/elsewhere/lib")):
        out = tmp_path / os.path.basename(sent)
        proc = run_mpilaunch(
            [
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--output-dir",
                str(out),
                "-x",
                f"LD_LIBRARY_PATH={sent}",
                "--",
                sys.executable,
                "-c",
                PRINT_LD_LIBRARY_PATH,
            ],
            install=intel,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert seen_ld_library_path(proc.stdout) == {r: expected for r in range(4)}, proc.stdout
        assert "saw other values" not in proc.stderr, proc.stderr
        env = json.loads((out / "report.json").read_text())["environment"]
        assert env["verified"] is True and env["env_digest_differs"] == [] and env["env_differs"] == []
