"""The rank wrapper's lines: what ``mpilaunch.rank`` prints on every rank, and how mpilaunch reads them.

Every line starts with a fixed prefix and ends in the launch's token
(``token=T``, ``new_token``): mpilaunch counts only lines carrying its token,
so a program that prints such a line cannot forge a rank's start or exit.
Formatting runs in the wrapper, once per rank, parsing in mpilaunch; both
sides import this module, so it stays standard library only, with ``re``
imported by the parsers alone (the wrapper never parses).
"""

from __future__ import annotations

import os

from . import env_names, rank_env

STATUS_PREFIX = "mpilaunch-rank-status:"
START_PREFIX = "mpilaunch-rank-start:"
MPI_PREFIX = "mpilaunch-rank-mpi:"
ENV_PREFIX = "mpilaunch-rank-env:"
#: the per-launch token (``new_token``); the program never sees it (``program_env``)
UNKNOWN = "?"  # a value the rank's environment does not give
# Not under any worker's agent or pod: mpirun forked the rank next to itself.
NO_WORKER = UNKNOWN

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


def first_env(names, environ) -> str | None:
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    return None


#: appended to a status line when the kernel's OOM killer ended the program
OOM_MARK = " oom=1"


def new_token() -> str:
    """A launch's token for the wrappers' lines (mpilaunch's side; os.urandom: no secrets/hashlib import)."""
    return os.urandom(8).hex()


def _signed(token: str | None) -> str:
    """The end of a wrapper's line: its launch's token (none: a line of a caller that has none)."""
    return f" token={token}" if token else ""


def _token_pattern(token: str | None) -> str:
    """What a parser requires after a line's fields: exactly ``token`` (None: any token or none)."""
    return " token=" + token if token else ""  # a token is hex: nothing to escape


def format_status(rank: str, worker: str, code: int, oom: bool = False, token: str | None = None) -> str:
    return f"{STATUS_PREFIX} rank={rank} worker={worker} exit={code}" + (OOM_MARK if oom else "") + _signed(token)


_STATUS_PATTERN = r" rank=(\d+) worker=(\S+) exit=(-?\d+)"


def parse_status(text: str, token: str | None = None) -> tuple[int, str, int] | None:
    """The wrapper's status line -> (rank, worker, exit code); with ``token``, only a line carrying it.

    Searched anywhere in the line: MPI runtimes sometimes glue a NUL, the
    unterminated tail of an earlier write, or a stray tag (hydra: "exit=7[3] ")
    around it.
    """
    if STATUS_PREFIX not in text:  # most lines of a job's output: no regex for them
        return None
    import re  # cached after the first line; keeps the wrapper's start light

    m = re.search(
        re.escape(STATUS_PREFIX) + _STATUS_PATTERN + "(?:" + re.escape(OOM_MARK) + ")?" + _token_pattern(token), text
    )
    if m is None:
        return None
    return int(m[1]), m[2], int(m[3])


def format_start(environ, program: str | None = None, token: str | None = None, cwd: str | None = None) -> str:
    """The start line: where this rank runs, as MPI and the worker's agent/pod tell it, the program
    its PATH resolved, a digest of the variables mpilaunch forwarded (the environment check) and
    the directory it runs in (--collect's relative globs start there: MPI chooses it, not us)."""
    rank = first_env(RANK_VARS, environ) or UNKNOWN
    local = first_env(LOCAL_RANK_VARS, environ) or UNKNOWN
    size = first_env(SIZE_VARS, environ) or UNKNOWN
    worker = environ.get(env_names.WORKER) or NO_WORKER
    host = os.uname().nodename or UNKNOWN
    return (
        f"{START_PREFIX} rank={rank} local={local} size={size} worker={worker} host={host} "
        f"program={rank_env.quote(program) if program else UNKNOWN} env={rank_env.forwarded_digest(environ)}"
        + (f" cwd={rank_env.quote(cwd)}" if cwd else "")
        + _signed(token)
    )


_START_PATTERN = r" rank=(\d+) local=(\d+|\?) size=(\d+|\?) worker=(\S+) host=(\S+)"
_START_ENV_PATTERN = r" program=(\S+) env=([0-9a-f]{8})(?: cwd=(\S+))?"  # cwd: wrappers since --collect


def parse_start_env(text: str, token: str | None = None) -> tuple[str | None, str | None]:
    """(program, digest of forwarded variables) from a start line; None for what it lacks."""
    parsed = parse_start_line(text, token)
    return (None, None) if parsed is None else parsed[1:]


def format_mpi(rank: str, worker: str, library: str, token: str | None = None) -> str:
    return f"{MPI_PREFIX} rank={rank} worker={worker} lib={rank_env.quote(library)}" + _signed(token)


def parse_mpi(text: str, token: str | None = None) -> tuple[int, str] | None:
    """(rank, library path) from the line the wrapper prints once the program loaded an MPI library."""
    if MPI_PREFIX not in text:
        return None
    import re

    m = re.search(re.escape(MPI_PREFIX) + r" rank=(\d+) worker=\S+ lib=(\S+)" + _token_pattern(token), text)
    return None if m is None else (int(m[1]), rank_env.unquote(m[2]))


def format_env(rank: str, worker: str, changed: list, token: str | None = None) -> str:
    """The line naming the forwarded variables this rank sees otherwise than sent
    (``rank_env.changed_forwarded``): ``NAME=VALUE`` each, a bare ``NAME`` when unset."""
    fields = " ".join(name if value is None else f"{name}={rank_env.quote(value)}" for name, value in changed)
    return f"{ENV_PREFIX} rank={rank} worker={worker} {fields}" + _signed(token)


def parse_env(text: str, token: str | None = None) -> tuple[int, dict] | None:
    """(rank, {name: value as shown, None: unset}) from a ``format_env`` line."""
    if ENV_PREFIX not in text:
        return None
    import re

    fields = r"(.*?)" + _token_pattern(token) if token else r"(.*?)\s*$"
    m = re.search(re.escape(ENV_PREFIX) + r" rank=(\d+) worker=\S+ " + fields, text)
    if m is None:
        return None
    seen = {}
    for field in m[2].split():
        name, eq, value = field.partition("=")
        seen[name] = rank_env.unquote(value) if eq else None
    return int(m[1]), seen


def parse_start_line(text: str, token: str | None = None):
    """A start line -> ((rank, local rank, size, worker, host), program, forwarded-variable digest),
    or None; unknown numbers are None, and so are the program and digest of a line without them.
    With ``token``, only a line carrying it (and its environment fields) counts."""
    m = _start_match(text, token)
    if m is None:
        return None
    number = lambda v: None if v == UNKNOWN else int(v)  # noqa: E731
    program = None if m[6] in (None, UNKNOWN) else rank_env.unquote(m[6])
    return (int(m[1]), number(m[2]), number(m[3]), m[4], m[5]), program, m[7]


def _start_match(text: str, token: str | None):
    if START_PREFIX not in text:
        return None
    import re

    env_fields = _START_ENV_PATTERN + _token_pattern(token) if token else f"(?:{_START_ENV_PATTERN})?"
    return re.search(re.escape(START_PREFIX) + _START_PATTERN + env_fields, text)


def parse_start_cwd(text: str, token: str | None = None) -> str | None:
    """The directory a start line says its rank runs in (None: a wrapper that did not say)."""
    m = _start_match(text, token)
    return None if m is None or not m[8] else rank_env.unquote(m[8])


def parse_start(text: str, token: str | None = None) -> tuple[int, int | None, int | None, str, str] | None:
    """The start line -> (rank, local rank, size, worker, host); unknown numbers are None."""
    parsed = parse_start_line(text, token)
    return None if parsed is None else parsed[0]
