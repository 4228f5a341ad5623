"""Remembered ``mpirun --version`` answers, keyed by the binary's identity.

Asking mpirun its version costs 10-20 ms on every launch (a fork, an exec,
the MPI's own start-up), a noticeable share of a short local job. The answer
only changes when the file does, so it is kept in
``$XDG_CACHE_HOME/mpilaunch/mpi-versions.json`` (``~/.cache`` by default)
under the resolved path, inode, size and modification time: an upgrade, a
switched Debian alternative or a rebuilt MPI is a different key. A cache
that cannot be read or written is simply not used.
"""

from __future__ import annotations

import json
import os

MAX_ENTRIES = 64  # a machine has a handful of MPIs; old keys (upgrades) are dropped first


def cache_file(environ=os.environ) -> str:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpilaunch", "mpi-versions.json")


def cache_dir(name: str) -> str:
    """``name`` in the user's mpilaunch cache, beside the remembered versions, made private (0700)
    when missing; OSError where it cannot be."""
    directory = os.path.join(os.path.dirname(cache_file()), name)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return directory


def identity(path: str) -> str | None:
    """What makes two answers interchangeable: the file behind every symlink, as it is now."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


def _load(file: str) -> dict:
    try:
        with open(file) as f:
            entries = json.load(f)
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}


def remembered(path: str, file: str | None = None) -> str | None:
    key = identity(path)
    if key is None:
        return None
    text = _load(file or cache_file()).get(key)
    return text if isinstance(text, str) else None


def remember(path: str, text: str, file: str | None = None) -> None:
    key = identity(path)
    if key is None:
        return
    file = file or cache_file()
    entries = _load(file)
    entries.pop(key, None)
    entries[key] = text
    while len(entries) > MAX_ENTRIES:
        entries.pop(next(iter(entries)))
    try:
        os.makedirs(os.path.dirname(file), exist_ok=True)
        tmp = f"{file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, file)  # concurrent launches: the last whole file wins
    except OSError:
        pass
