"""What the rank wrapper adds to a rank's environment, and what it reports of it.

- PATH: the rank's program gets the PATH its worker had before mpirun's
  daemon started (``MPILAUNCH_WORKER_PATH``), not
  the one Open MPI's implied ``--prefix`` put its own bin directory ahead in.
- torch.distributed's env rendezvous (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``) from the MPI runtime's variables and the plan, unless the
  user set them.
- The environment check's facts: the program the rank resolved, a digest of
  the variables mpilaunch forwarded, and the MPI library the program loaded
  (read from ``/proc/PID/maps``).

Standard library only, and only built-in modules: it runs in every rank's
wrapper (the hot-path import contract in pyproject.toml).
"""

from __future__ import annotations

import os

WORKER_PATH_ENV = "MPILAUNCH_WORKER_PATH"  # set by mpilaunch (mpi/command.py, the shim), read here
WORKER_CWD_ENV = "MPILAUNCH_WORKER_CWD"  # the worker's directory, set by the shim's remote command
FORWARDED_LIST_ENV = "MPILAUNCH_FORWARDED"  # the names mpilaunch forwards, for forwarded_digest
WORKER_SLOTS_ENV = "MPILAUNCH_WORKER_SLOTS"  # "4,4": each worker's slots in plan order
MASTER_ADDR_ENV = "MPILAUNCH_MASTER_ADDR"
MASTER_PORT_ENV = "MPILAUNCH_MASTER_PORT"
# a packed environment unpacked into each container (YARN --env-archive): its path differs per container
ENV_DIR_ENV = "MPILAUNCH_ENV_DIR"

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
        return f"${ENV_DIR_ENV}{program[len(root):]}"
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
        "RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": local_size,
        "NODE_RANK": None if node is None else str(node),
        "MASTER_ADDR": env.get(MASTER_ADDR_ENV), "MASTER_PORT": env.get(MASTER_PORT_ENV),
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


def forwarded_digest(env: dict) -> str:
    names = [n for n in env.get(FORWARDED_LIST_ENV, "").split(",") if n]
    return digest((n, env.get(n, "")) for n in names)


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
    """A field value for a start/env line: no spaces (paths can have them)."""
    return text.replace("%", "%25").replace(" ", "%20")


def unquote(text: str) -> str:
    return text.replace("%20", " ").replace("%25", "%")
