"""Render and parse hostfiles for each MPI flavour.

Each flavour writes its own syntax (``mpi.MpiFlavour.hostfile_line``): Open
MPI ``host slots=N``; MPICH / Intel MPI (hydra machinefile) ``host:N``. A
user's hostfile is read in either.
"""

from __future__ import annotations

import re

from . import mpi
from .errors import UsageError

_OPENMPI_LINE = re.compile(r"^(?P<host>\S+)(?:\s+(?P<opts>.*))?$")
_HYDRA_LINE = re.compile(r"^(?P<host>[^\s:]+)(?::(?P<slots>\d+))?\s*$")


def render(hosts: list[tuple[str, int]], flavour: str) -> str:
    strategy = mpi.FLAVOURS.get(flavour)
    if strategy is None:
        raise ValueError(f"no hostfile format for MPI flavour {flavour!r}")
    return strategy.render_hostfile(hosts)


def check_host_name(host: str, number: int) -> None:
    """A hostfile's host names become file names (a worker's agent log in the run directory, its
    private temp directory) and words of commands (a host name, an ssh target): one with ``/``
    would write outside the run directory, ``@`` would be an ssh login name, and a leading ``-``
    an option."""
    if "/" in host or "@" in host or host.startswith("-"):
        raise UsageError(
            f"hostfile line {number}: host name {host!r} has a '/', an '@' or a leading '-'",
            "name each host by its name or address alone (letters, digits, '.', '-', '_'); "
            "an ssh login name goes in your ssh config (User) or --ssh-option User=NAME",
        )


def parse(text: str) -> list[tuple[str, int]]:
    """Parse either format; comments and blank lines are skipped, slots default to 1."""
    hosts: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        hydra = _HYDRA_LINE.match(line)
        if hydra and ":" in line:
            check_host_name(hydra["host"], number)
            hosts.append((hydra["host"], int(hydra["slots"] or 1)))
            continue
        match = _OPENMPI_LINE.match(line)
        check_host_name(match["host"], number)
        slots = 1
        for opt in (match["opts"] or "").split():
            key, _, value = opt.partition("=")
            if key == "slots":
                if not value.isdigit() or int(value) < 1:
                    raise UsageError(
                        f"hostfile line {number}: bad slots in {raw.strip()!r}",
                        "write 'host slots=N' (Open MPI) or 'host:N' (MPICH) with N >= 1",
                    )
                slots = int(value)
        hosts.append((match["host"], slots))
    if not hosts:
        raise UsageError("the hostfile lists no hosts", "write one 'host slots=N' line per worker")
    return hosts


def read(path: str) -> list[tuple[str, int]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(
            f"cannot read hostfile {path}: {e.strerror or e}",
            "check the path and its permissions",
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"hostfile {path} is not text", "give a text file with 'host slots=N' lines") from None
    return parse(text)
