"""Settings a user's shell or image carries that would change how mpirun starts its daemons.

mpirun reads its launch mechanism, its host list and its resource manager
from the environment before its command line is even parsed: an image that
sets ``OMPI_MCA_plm=isolated`` (seen on an Ubuntu 24.04 image) makes Open MPI
refuse every remote host, ``PRTE_MCA_plm`` does the same to Open MPI 5, and
inside a Slurm, PBS, LSF or SGE allocation Open MPI's ``ras`` takes its host
list from the allocation instead of mpilaunch's hostfile. mpilaunch pins the
launch on mpirun's command line (``mpi.build_mpirun``) and leaves these
variables out of the launch's environment (mpirun, the local workers' agents
and so their daemons and ranks), naming each one once in a warning.

Pure: environment in, (kept environment, what was left out) out.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import mpi

# Why a family is left out: one clause per family, for the warning line (each MPI flavour's
# own launch settings: its strategy's pinned_setting, mpi/<flavour>.py).
RESOURCE_MANAGER = "resource-manager variables (mpirun would take its host list from that allocation)"
TORCH_RENDEZVOUS = "torch.distributed variables (every rank gets its own; -x NAME=VALUE sets one for all ranks)"
# torch.distributed's env:// variables: a shell started by torchrun or inside
# another job has them, and every rank would claim the same RANK.
_TORCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")

# Variables Open MPI's and Hydra's resource-manager components read.
_RM_PREFIXES = ("SLURM_", "LSB_")
_RM_NAMES = ("PBS_NODEFILE", "PBS_JOBID", "PBS_ENVIRONMENT", "PE_HOSTFILE", "JOB_ID")


@dataclass(frozen=True)
class Override:
    """A variable of the caller's environment that mpilaunch sets differently for the launch."""

    name: str
    value: str
    family: str


def family_of(name: str, flavour: str) -> str | None:
    """The family ``name`` belongs to when mpilaunch overrides it for ``flavour``, else None.

    Resource-manager variables matter to every flavour (Open MPI's ras,
    Hydra's rmk); each runtime's own launch settings only to that runtime.
    """
    if name.startswith(_RM_PREFIXES) or name in _RM_NAMES:
        return RESOURCE_MANAGER
    strategy = mpi.FLAVOURS.get(flavour)
    pinned = strategy.pinned_setting(name) if strategy is not None else None
    if pinned:
        return pinned
    if name in _TORCH_NAMES:
        return TORCH_RENDEZVOUS
    return None


def split(environ: dict[str, str], flavour: str, keep=()) -> tuple[dict[str, str], list[Override]]:
    """(the environment without the overridden settings, the overridden ones in name order).
    ``keep``: names the user forwards explicitly (``-x NAME``), left alone."""
    kept, left_out = {}, []
    for name in sorted(environ):
        family = None if name in keep else family_of(name, flavour)
        if family is None:
            kept[name] = environ[name]
        else:
            left_out.append(Override(name, environ[name], family))
    return kept, left_out


def warnings(overrides: list[Override], listed: int = 6) -> list[str]:
    """One ``mpilaunch: warning:`` line per family, naming every variable in it (the first
    ``listed`` with their values: a Slurm allocation sets dozens)."""
    lines = []
    for family in dict.fromkeys(o.family for o in overrides):
        members = [o for o in overrides if o.family == family]
        shown = ", ".join(f"{o.name}={o.value}" if len(o.value) <= 40 else f"{o.name}=..." for o in members[:listed])
        rest = [o.name for o in members[listed:]]
        more = f" and {', '.join(rest)}" if rest else ""
        lines.append(f"mpilaunch: warning: ignoring {shown}{more} from your environment: {family}")
    return lines
