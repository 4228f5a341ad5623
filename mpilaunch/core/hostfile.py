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
        check_keys(match["opts"], number, raw)
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


# The keys of an Open MPI hostfile line mpilaunch reads: slots= sizes the worker; max_slots= (or
# max-slots=) caps oversubscription, which mpilaunch never does (a worker gets exactly its slots),
# so it is checked and otherwise left alone. Any other word was once skipped without a word:
# "n1 slot=8" became a worker of 1 slot.
KNOWN_KEYS = ("slots", "max_slots", "max-slots")


def check_keys(opts: str | None, number: int, raw: str) -> None:
    """Every ``key=value`` after an Open MPI line's host is one mpilaunch reads, with a count >= 1."""
    for opt in (opts or "").split():
        key, eq, value = opt.partition("=")
        if key not in KNOWN_KEYS or not eq:
            near = " (did you mean slots=?)" if key in ("slot", "cpu", "cpus", "count") else ""
            raise UsageError(
                f"hostfile line {number}: unknown {'key ' + repr(key) if eq else 'word ' + repr(opt)} in "
                f"{raw.strip()!r}{near}",
                "a line is 'HOST', 'HOST slots=N' (max_slots=N may follow) or 'HOST:N'; "
                f"the keys mpilaunch reads are {', '.join(k + '=' for k in KNOWN_KEYS)}",
            )
        if not value.isdigit() or int(value) < 1:
            raise UsageError(
                f"hostfile line {number}: bad {key} in {raw.strip()!r}",
                f"write {key}=N with N >= 1",
            )


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
