"""The MPI flavours mpilaunch knows: name -> strategy (``base.MpiFlavour``).

A new flavour is one module implementing ``base.MpiFlavour`` and one entry
in ``_BUILT_IN`` below. Everything that differs between flavours is asked of
the flavour found here; everything else (what the ranks get, detection's
search, reading mpirun's output) is shared.
"""

from __future__ import annotations

from .base import MpiFlavour
from .intel import IntelMpi
from .mpich import Mpich
from .openmpi import OpenMpi

# In the order --mpi lists them.
_BUILT_IN = (OpenMpi(), Mpich(), IntelMpi())

FLAVOURS: dict[str, MpiFlavour] = {}


def register(flavour: MpiFlavour) -> MpiFlavour:
    FLAVOURS[flavour.name] = flavour
    return flavour


for _flavour in _BUILT_IN:
    register(_flavour)


def names() -> tuple[str, ...]:
    """Every flavour's name, in registration order (--mpi's choices besides ``auto``)."""
    return tuple(FLAVOURS)


def for_name(name: str) -> MpiFlavour:
    try:
        return FLAVOURS[name]
    except KeyError:
        raise ValueError(f"unknown MPI flavour {name!r} (known: {', '.join(FLAVOURS)})") from None


def detection_order() -> list[MpiFlavour]:
    """Flavours built on another one first: Intel's hydra descends from MPICH's and its
    ``--version`` may print MPICH's words as well as its own."""
    return sorted(FLAVOURS.values(), key=lambda f: -len(type(f).__mro__))


def described() -> str:
    """ "Open MPI 4/5, MPICH and Intel MPI": what mpilaunch knows, for messages."""
    titles = [f.supported or f.title for f in FLAVOURS.values()]
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
