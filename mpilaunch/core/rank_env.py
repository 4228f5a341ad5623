"""What the rank wrapper adds to a rank's environment, and what it reports of it.

- PATH: the rank's program gets the PATH its worker had before mpirun's
  daemon started (``MPILAUNCH_WORKER_PATH``), not
  the one Open MPI's implied ``--prefix`` put its own bin directory ahead in.
- torch.distributed's env rendezvous (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``) from the MPI runtime's variables and the plan, unless the
  user set them.
- The environment check's facts: the program the rank resolved, a digest of
  the variables mpilaunch forwarded, each forwarded variable whose value is not
  the one sent (its value, masked unless it is a path list), and the MPI library
  the program loaded (read from ``/proc/PID/maps``).

Standard library only, and only built-in modules: it runs in every rank's
wrapper (the hot-path import contract in pyproject.toml).
"""

from __future__ import annotations

import os

from . import env_names

WORKER_PATH_ENV = env_names.WORKER_PATH  # set by mpilaunch (mpi/command.py, the shim), read here
WORKER_CWD_ENV = env_names.WORKER_CWD  # the worker's directory, set by the shim's remote command
# the names mpilaunch forwards, each with the digest of the value sent ("NAME=1a2b3c4d,..."):
# forwarded_digest, changed_forwarded
FORWARDED_LIST_ENV = env_names.FORWARDED
WORKER_SLOTS_ENV = env_names.WORKER_SLOTS  # "4,4": each worker's slots in plan order
MASTER_ADDR_ENV = env_names.MASTER_ADDR
MASTER_PORT_ENV = env_names.MASTER_PORT
# a packed environment unpacked into each container (YARN --env-archive): its path differs per container
ENV_DIR_ENV = env_names.ENV_DIR

_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")


def restore_worker_path(env: dict) -> None:
    """Give the program the worker's own PATH back (mpirun's prefix stays with the daemons)."""
    path = env.pop(WORKER_PATH_ENV, None)
    if path:
        env["PATH"] = path


def resolve_program(name: str, path: str) -> str | None:
    """Where ``name`` runs from with this PATH, as execvp finds it (no symlink resolved:
    a venv's python3 is a link to the system one, and which of the two ran is the point)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) else None
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def reported_program(program: str | None, env: dict) -> str | None:
    """The program as the environment check compares it across ranks: one inside the container's
    own copy of a packed environment (``$MPILAUNCH_ENV_DIR``) relative to that copy, so the same
    program of the same archive reads the same in every container."""
    root = (env.get(ENV_DIR_ENV) or "").rstrip("/")
    if program and root and program.startswith(root + "/"):
        return f"${ENV_DIR_ENV}{program[len(root) :]}"
    return program


def node_of(rank: int, slots: list[int]) -> int | None:
    """The worker index of ``rank`` when ranks fill the workers' slots in order (``--map-by slot``)."""
    total = 0
    for index, n in enumerate(slots):
        total += n
        if rank < total:
            return index
    return None


def torch_env(env: dict, rank: str | None, local: str | None, size: str | None) -> dict:
    """torch.distributed's ``env://`` variables this rank lacks, from MPI's and the plan's."""
    out = {}
    slots = [int(s) for s in env.get(WORKER_SLOTS_ENV, "").split(",") if s.isdigit()]
    node = node_of(int(rank), slots) if rank is not None and rank.isdigit() else None
    # The plan's count first (each worker runs exactly its slots: the placement check holds
    # mpirun to it); MPI's variable only without one. Open MPI 5.0.11 sets
    # OMPI_COMM_WORLD_LOCAL_SIZE=1 on every worker when they hold different numbers of
    # ranks (slots 2,1 gave 1,1,1).
    if node is not None:
        local_size = str(slots[node])
    else:
        local_size = next((env[n] for n in _LOCAL_SIZE_VARS if env.get(n)), None)
    values = {
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": local,
        "LOCAL_WORLD_SIZE": local_size,
        "NODE_RANK": None if node is None else str(node),
        "MASTER_ADDR": env.get(MASTER_ADDR_ENV),
        "MASTER_PORT": env.get(MASTER_PORT_ENV),
    }
    for name, value in values.items():
        if value is not None and not env.get(name):
            out[name] = value
    return out


def digest(pairs) -> str:
    """FNV-1a (32 bit) of ``NAME=VALUE`` lines: the same value here and in mpilaunch for
    the same variables, without importing hashlib/zlib into every rank."""
    h = 0x811C9DC5
    for name, value in pairs:
        for byte in f"{name}={value}\n".encode("utf-8", "surrogateescape"):
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "%08x" % h


def forwarded_list(values: dict) -> str:
    """``FORWARDED_LIST_ENV``'s value: each forwarded name with the digest of the value sent."""
    return ",".join(f"{name}={digest([(name, value)])}" for name, value in values.items())


def _forwarded_sent(env: dict) -> list:
    """(name, digest of the value sent, or None) for each name in ``FORWARDED_LIST_ENV``."""
    entries = [e.partition("=") for e in env.get(FORWARDED_LIST_ENV, "").split(",") if e]
    return [(name, sent or None) for name, _, sent in entries]


def forwarded_digest(env: dict) -> str:
    return digest((n, env.get(n, "")) for n, _ in _forwarded_sent(env))


def changed_forwarded(env: dict) -> list:
    """(name, value as shown, None: unset) for each forwarded variable whose value here is not
    the one mpilaunch sent: what the environment check names. A secret's value never leaves
    the rank: only ``shown_value``'s mask of it."""
    changed = []
    for name, sent in _forwarded_sent(env):
        if sent is not None and digest([(name, env.get(name, ""))]) != sent:
            value = env.get(name)
            changed.append((name, None if value is None else shown_value(name, value)))
    return changed


def is_path_list(name: str) -> bool:
    """A ``:``-separated list of directories (PATH, LD_LIBRARY_PATH, PYTHONPATH, ...)."""
    return name.endswith("PATH")


def shown_value(name: str, value: str) -> str:
    """A forwarded value as the environment check shows it: path lists and LD_PRELOAD in clear
    (paths, not secrets: mpirun's own command line carries them, mpi.command.MPIRUN_OWN_NAMES),
    any other masked as ``render`` and --dry-run mask every forwarded value (``mask``)."""
    return value if is_path_list(name) or name == "LD_PRELOAD" else mask(value)


def mask(value: str) -> str:
    """What --dry-run and ``mpilaunch render`` show instead of a forwarded value."""
    return f"<set, {len(value)} chars>"


def with_directory_first(path_list: str | None, directory: str) -> str:
    """``directory`` ahead of the entries of ``path_list``, unless it is one of them already
    (a second copy would change nothing the loader finds, only what the ranks report)."""
    if not path_list:
        return directory
    if directory in path_list.split(os.pathsep):
        return path_list
    return directory + os.pathsep + path_list


def mpi_library(maps: str) -> str | None:
    """The MPI library a process has mapped (its path), from /proc/PID/maps, or None.

    Open MPI's is libmpi.so.40.*, MPICH's libmpich.so.12.* (Debian) or
    libmpi.so.12.* (PyPI's, Intel MPI's).
    """
    for line in maps.splitlines():
        slash = line.find("/")
        if slash < 0:
            continue
        path = line[slash:]
        base = path.rsplit("/", 1)[-1]
        if base.startswith(("libmpi.so.", "libmpich.so.")):
            return path
    return None


def quote(text: str) -> str:
    """A field value for a wrapper's line: no space, no line break, no control character (a
    path can have spaces, a variable's value anything): each is %XX, and so is %."""
    return "".join(c if " " < c != "%" and c != "\x7f" else "%%%02X" % ord(c) for c in text)


def unquote(text: str) -> str:
    if "%" not in text:
        return text
    import re  # mpilaunch's side only: the wrapper quotes

    return re.sub("%([0-9A-F]{2})", lambda m: chr(int(m[1], 16)), text)
