"""Intel MPI: MPICH's hydra with its own banner, bootstrap options, machinefile and library path."""

from __future__ import annotations

import os
import re

from .. import env_names
from .base import MpiInfo
from .mpich import Mpich

# The rank wrapper puts this directory first on the program's LD_LIBRARY_PATH
# (prepended there, so the worker's own entries, e.g. CUDA's, stay).
LIBDIR_ENV = env_names.MPI_LIBDIR
# Intel MPI prints its banner ("Intel(R) MPI Library for Linux* OS, Version
# 2021.18.1 Build ...", 2019's "Version 2019 Update 9").
_VERSION = re.compile(r"Intel\(R\) MPI Library.*?Version\s+(\d+[\w.]*)", re.S)


def hydra_sibling(path: str) -> str:
    """Intel's ``mpirun`` wrapper script -> the ``mpiexec.hydra`` next to it, which mpilaunch runs directly."""
    sibling = os.path.join(os.path.dirname(path), "mpiexec.hydra")
    return sibling if os.path.basename(path) != "mpiexec.hydra" and os.access(sibling, os.X_OK) else path


class IntelMpi(Mpich):
    name = "intel"
    title = "Intel MPI"
    executables = ("mpiexec.hydra", "mpirun", "mpiexec")
    # Intel's -f reads host names only and fills each host with as many
    # ranks as the launching machine has cores (seen: --np 2 on two
    # 1-slot workers put both on the first); its -machinefile honours
    # ``host:n``.
    hostfile_option = "-machinefile"

    def parse_version(self, text: str) -> str | None:
        m = _VERSION.search(text)
        return m.group(1) if m else None

    def resolve_path(self, path: str) -> str:
        return hydra_sibling(path)

    def agent_env(self, shim: str, hostfile: str) -> dict[str, str]:
        # Intel's hydra ignores HYDRA_LAUNCHER (MPICH's names are set by mpich.py's flavour)
        return {"I_MPI_HYDRA_BOOTSTRAP": "rsh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": shim, "I_MPI_HYDRA_HOST_FILE": hostfile}

    def bootstrap_args(self, shim: str) -> list[str]:
        return ["-bootstrap", "rsh", "-bootstrap-exec", shim]

    def rank_env(self, info: MpiInfo) -> dict[str, str]:
        return {LIBDIR_ENV: info.libdir}

    def prepended_dirs(self, info: MpiInfo) -> tuple[str, ...]:
        return (info.libdir,)  # the rank wrapper's, from LIBDIR_ENV

    def agent_setting(self, major: int) -> str:
        return (
            "Intel MPI takes the agent from -bootstrap rsh -bootstrap-exec / "
            "I_MPI_HYDRA_BOOTSTRAP(_EXEC) and ignores HYDRA_LAUNCHER"
        )
