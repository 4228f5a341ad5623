"""The MPI flavours: detect one, and build the exact mpirun argv + environment for it.

Each flavour (Open MPI, MPICH's hydra, Intel MPI) is a strategy object
(``base.MpiFlavour``) in a module of its own, registered in ``registry.py``:
its detection, argv, hostfile syntax, rank-wrapper options, hints and what its
mpirun prints about failures. The shared parts: ``command.py`` (what the
ranks get), ``detection.py`` (``mpirun --version``, the PATH search;
remembered by ``versions.py``), ``tags.py`` and ``failures.py`` (mpirun's
output). Everything here except :func:`detect` and :func:`find_mpirun` is
pure: each flavour's command line is unit-tested without running anything.

A new flavour: ``mpi/<name>.py`` implementing ``base.MpiFlavour`` and one
entry in ``registry._BUILT_IN``.
"""

from __future__ import annotations

from ..rank_env import FORWARDED_LIST_ENV, WORKER_PATH_ENV  # noqa: F401  (mpi.WORKER_PATH_ENV: workloads)
from .base import LaunchArgs, MpiFlavour, MpiInfo, MpirunCommand, mask  # noqa: F401
from .command import (  # noqa: F401
    FORWARDED_NAMES,
    FORWARDED_PREFIXES,
    MPIRUN_OWN_NAMES,
    agent_env,
    build_mpirun,
    forwarded_names,
    resolve_env,
)
from .detection import (  # noqa: F401
    AUTO_EXECUTABLES,
    announced_mpi,
    candidates,
    detect,
    find_mpirun,
    first_line,
    parse_version_output,
    search_path,
    unknown_mpi_error,
)
from .failures import daemon_error, first_failed_rank, launch_hint  # noqa: F401
from .intel import LIBDIR_ENV, hydra_sibling  # noqa: F401
from .openmpi import MIN_NUM_CONCURRENT, MIN_ROUTED_RADIX, PRRTE_SPAWN_ON_PROGRESS_THREAD, RAS_EXCLUDED, openmpi_agent  # noqa: F401
from .registry import FLAVOURS, detection_order, for_name, names, register  # noqa: F401
from .tags import split_tagged, tag_has_space  # noqa: F401
