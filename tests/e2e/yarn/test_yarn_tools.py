"""--env-archive whose Python environment lacks mpilaunch: mpilaunch's pieces are localized with the job.

The packed environment here is a real venv of this interpreter's base python
(``python -m venv --without-pip``), packed with its links as venv-pack would:
its ``bin/python`` cannot import mpilaunch; a ``.pth`` line gives it this
test venv's site-packages *directory* only (skein, mpi4py; the editable
mpilaunch install's finder is a ``.pth`` of that directory, which a plain
path line does not run). The job must run mpilaunch's own pieces from the
localized zip and the user's program in the environment untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from support.helpers import run_to_end
from support.yarn import assert_released, describe_app

pytestmark = pytest.mark.yarn

RANK_PROGRAM = r"""
import importlib.util, json, os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
print("RANKINFO " + json.dumps({
    "rank": comm.rank, "sum": total, "worker": os.environ.get("MPILAUNCH_WORKER"),
    "prefix": sys.prefix,
    "mpilaunch": importlib.util.find_spec("mpilaunch") is not None,
    "usermod": importlib.util.find_spec("usermod") is not None,
    "path": sys.path,
    "pythonpath": os.environ.get("PYTHONPATH"),
}), flush=True)
"""


def packed_env(tmp_path, name: str, python_script: str | None = None):
    """A venv without mpilaunch, packed as a .tar.gz; ``python_script`` replaces its bin/python."""
    env_dir = tmp_path / name
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    for activate in (env_dir / "bin").glob("[Aa]ctivate*"):  # a venv's own are not relocatable (venv-pack's are)
        activate.unlink()
    purelib = sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)})
    with open(os.path.join(purelib, "testvenv.pth"), "w") as f:
        f.write(sysconfig.get_path("purelib") + "\n")
    if python_script is not None:
        (env_dir / "bin" / "python").unlink()
        (env_dir / "bin" / "python").write_text(python_script)
        (env_dir / "bin" / "python").chmod(0o755)
    check = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import mpilaunch"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode != 0 and "No module named 'mpilaunch'" in check.stderr, check
    archive = tmp_path / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env_dir, arcname=".")
    return archive


def run_job(args, ctx, cwd, timeout=240, context=None) -> subprocess.CompletedProcess:
    """The job's run. --start-timeout below the test's own: a stalled allocation is reported by
    mpilaunch (what it waited for), and a job past the test's time gets SIGTERM (``finish``), so
    the failure shows what it printed (one run hung silently for 240 s in an empty-cache run)."""
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "yarn",
        "--mpirun",
        ctx["mpirun"],
        "--start-timeout",
        str(timeout // 2),
        *args,
    ]
    return run_to_end(cmd, timeout, context, cwd=cwd, env=ctx["env"])


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_env_archive_without_mpilaunch_runs_an_mpi_job(yarn, openmpi_env, tmp_path, launcher):
    archive = packed_env(tmp_path, "env")
    ok = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "-c", "import skein, mpi4py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "rank.py").write_text(RANK_PROGRAM)
    userlib = tmp_path / "userlib"
    userlib.mkdir()
    (userlib / "usermod.py").write_text("")
    name = f"yarn-tools-{launcher}"
    proc = run_job(
        [
            "--name",
            name,
            "--launcher",
            launcher,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "256 MiB",
            "--env-archive",
            str(archive),
            "--output-dir",
            str(tmp_path / "out"),
            "-x",
            f"PYTHONPATH={userlib}",
            "-q",
            "--",
            "python",
            str(tmp_path / "rank.py"),
        ],
        openmpi_env,
        cwd=tmp_path,
        context=lambda: describe_app(yarn, name),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + describe_app(yarn, name)
    ranks = sorted(
        (json.loads(line.split("RANKINFO ", 1)[1]) for line in proc.stdout.splitlines() if "RANKINFO " in line),
        key=lambda r: r["rank"],
    )
    assert [r["sum"] for r in ranks] == [10] * 4, proc.stdout
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2
    for r in ranks:
        # the archive's python ran the program, in the environment the user gave it
        assert r["prefix"].endswith("/mpilaunch-env"), r
        assert r["pythonpath"] == str(userlib) and r["usermod"], r
        # ... and mpilaunch's localized copy is on no path of it
        assert r["mpilaunch"] is False, r
        assert not [p for p in r["path"] if "mpilaunch-tools" in p], r["path"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["placement"]["verified"] is True, report["placement"]
    if launcher == "local":  # (the cluster launcher checks the environment in its container)
        # one program across containers, each with its own copy of the environment
        assert {r["program"] for r in report["environment"]["ranks"]} == {"$MPILAUNCH_ENV_DIR/bin/python"}
    assert_released(yarn, name, "SUCCEEDED")


# The environment's python without its site-packages: a python that cannot import skein.
NO_SKEIN = '#!/bin/sh\nexec "$(dirname "$0")/python3" -S "$@"\n'
# ... only in the worker containers: the ApplicationMaster's driver passes its check.
NO_SKEIN_IN_WORKERS = """#!/bin/sh
case "$SKEIN_CONTAINER_ID" in
  worker_*) exec "$(dirname "$0")/python3" -S "$@" ;;
  *) exec "$(dirname "$0")/python3" "$@" ;;
esac
"""


@pytest.mark.parametrize("where", ["driver", "detached", "workers"])
def test_env_archive_without_mpilaunch_or_skein_fails_in_one_line(yarn, openmpi_env, tmp_path, where):
    """skein cannot travel as sources (grpcio): the archive must have it, and its lack is one line, exit 3.

    driver: the attached job's reaper finds it first (the application ends);
    detached: the driver only checks, then holds; workers: their containers end.
    """
    archive = packed_env(tmp_path, "env", python_script=NO_SKEIN_IN_WORKERS if where == "workers" else NO_SKEIN)
    name = f"yarn-noskein-{where}"
    proc = run_job(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "--env-archive",
            str(archive),
            "--start-timeout",
            "60",
            "-q",
            *(["--detach"] if where == "detached" else []),
            "--",
            "python",
            "-c",
            "pass",
        ],
        openmpi_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: error:")]
    assert errors == [
        f"mpilaunch: error: --env-archive: its bin/python (Python {sys.version.split()[0]}) "
        "cannot import skein: ModuleNotFoundError: No module named 'skein'"
    ], proc.stderr
    assert "hint: pack skein into the environment" in proc.stderr and "Traceback" not in proc.stderr
    # the driver's exit ends the application (FAILED); an allocation failure is killed
    assert_released(yarn, name, "KILLED" if where == "workers" else "FAILED")


def test_env_archive_tools_run_without_mpilaunch_installed(tmp_path):
    """The localized zip alone runs mpilaunch's pieces under a python without mpilaunch (no cluster)."""
    import zipfile

    from mpilaunch.backends.yarn import tools as yarn_tools

    zipped = yarn_tools.build(tmp_path)
    with zipfile.ZipFile(zipped) as z:
        names = z.namelist()
        z.extractall(tmp_path / "tools")
    assert "run.py" in names and "mpilaunch/rank.py" in names and "mpilaunch/agent/__main__.py" in names
    # no bytecode of this checkout's own (__pycache__); the zip's .pyc files are image_tools' own,
    # each beside its source, which an interpreter of another version compiles instead
    assert not [n for n in names if "__pycache__" in n]
    assert "mpilaunch/rank.pyc" in names and all(n[:-1] in names for n in names if n.endswith(".pyc"))
    base = sys._base_executable  # this interpreter without the venv: no mpilaunch on it
    runner = str(tmp_path / "tools" / "run.py")
    rank = subprocess.run(
        [base, "-IS", runner, "-m", "mpilaunch.rank", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
    )
    assert rank.returncode == 0 and "mpilaunch-rank-status:" in rank.stderr, rank.stderr
    # anything but mpilaunch's modules: the python itself, not isolated, nothing of the tools on its path
    other = subprocess.run(
        [base, "-IS", runner, "-c", "import sys; print(sys.flags.isolated, sys.path)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 0 and other.stdout.startswith("0 ") and "tools" not in other.stdout, other
    missing = subprocess.run(
        [base, "-IS", runner, "--require", "no_such_module_here", "-m", "mpilaunch.rank"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 3, missing
    assert yarn_tools.check_line(missing.stderr) == (
        f"--env-archive: its bin/python (Python {sys.version.split()[0]}) cannot import no_such_module_here: "
        "ModuleNotFoundError: No module named 'no_such_module_here'"
    )


def test_env_archive_program_reads_the_same_in_every_container():
    from mpilaunch.core.rank_env import reported_program

    env = {"MPILAUNCH_ENV_DIR": "/nm/appcache/container_1/mpilaunch-env"}
    assert reported_program("/nm/appcache/container_1/mpilaunch-env/bin/python", env) == "$MPILAUNCH_ENV_DIR/bin/python"
    assert reported_program("/usr/bin/python3", env) == "/usr/bin/python3"  # outside it: as it is
    assert reported_program("/nm/appcache/container_1/mpilaunch-env2/bin/python", env).startswith("/nm/")
    assert reported_program("/opt/venv/bin/python", {}) == "/opt/venv/bin/python"
