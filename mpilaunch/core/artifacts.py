"""--collect and --timeline, the pure part: sizes, the caps, and where each file goes.

The files come out of the workers through the channel the job already has
(``runtime/artifacts.py``); what to take is decided here, from the workers' listings
alone, so that every skipped file gets its one line and the caps hold for the
whole job, whatever order the workers answer in.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from .errors import UsageError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: what a job brings back at most, all workers together, unless --collect-max says otherwise
DEFAULT_MAX_BYTES = 1 * GIB
#: and one file at most (--collect-max-file)
DEFAULT_MAX_FILE_BYTES = 512 * MIB
#: the folder under --output-dir (or the record's directory) that holds WORKER/relative/path
FILES_DIR = "files"
#: the variable Horovod reads for its timeline (horovodrun --timeline-filename sets it too)
TIMELINE_ENV = "HOROVOD_TIMELINE"

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": 1 << 40}


def parse_size(option: str, text: str) -> int:
    """``1G``, ``512M``, ``100k``, ``1.5GiB``, ``4096``: bytes (binary units; a size is at least 1 byte)."""
    m = _SIZE.fullmatch(str(text))
    if m is None or (m[3] and m[3].lower() not in ("b", "ib")):
        raise UsageError(f"{option} takes a size such as 1G, 512M or 4096 (bytes); got {text!r}", _size_hint(option))
    value = int(float(m[1]) * _UNITS[m[2].lower()])
    if value < 1:
        raise UsageError(f"{option} must be at least 1 byte, got {text!r}", _size_hint(option))
    return value


def _size_hint(option: str) -> str:
    return f"e.g. {option} 1G (units K, M, G, T are powers of 1024)"


def format_size(n: int) -> str:
    """``3.2 GiB``, ``512 MiB``, ``12.0 KiB``, ``300 B``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def check_globs(globs: tuple[str, ...]) -> None:
    for pattern in globs:
        if not pattern or "\0" in pattern or "\n" in pattern:
            raise UsageError(
                f"--collect takes a glob, relative to the ranks' working directory or absolute; got {pattern!r}",
                "e.g. --collect 'results/*.json' --collect /tmp/profile.json",
            )


def timeline_glob(path: str) -> str:
    """--timeline's file as a --collect glob matching that one file (its name may hold '*' or '[')."""
    import glob  # here: not on every launch's import path

    return glob.escape(path)


@dataclass(frozen=True)
class Found:
    """A file a worker listed: its path there, where it goes under the worker's folder, its size."""

    worker: str
    path: str
    name: str
    size: int
    source: str = ""  # what the worker reads: the path with its links resolved when it was listed


@dataclass(frozen=True)
class Choice:
    taken: tuple[Found, ...]
    skipped: tuple[str, ...]  # one line each, without the ``mpilaunch: collect: `` prefix

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.taken)


def choose(found: list[Found], max_bytes: int, max_file_bytes: int) -> Choice:
    """The files to bring back, workers and then paths in order, each while it fits both caps;
    one line for each file that does not (later, smaller files still go)."""
    taken, skipped, total = [], [], 0
    for f in sorted(found, key=lambda f: (f.worker, f.name)):
        where = f"{f.worker}:{f.path}"
        if f.size > max_file_bytes:
            skipped.append(
                f"skipped {where} ({format_size(f.size)} over the {format_size(max_file_bytes)} per-file cap)"
            )
        elif total + f.size > max_bytes:
            skipped.append(
                f"skipped {where} ({format_size(f.size)} over the {format_size(max_bytes)} cap, "
                f"{format_size(total)} collected before it)"
            )
        else:
            taken.append(f)
            total += f.size
    return Choice(tuple(taken), tuple(skipped))


def safe_name(name: str) -> str | None:
    """A worker's name for a file as a relative path that stays under the worker's folder; None
    for anything else (absolute, ``..``, empty): the names come from the worker, not from us."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return None
    normal = posixpath.normpath(name)
    if normal in (".", "..") or normal.startswith("../") or normal.startswith("/"):
        return None
    return normal


def safe_worker(worker: str) -> bool:
    """A worker's name as one folder name (the plan's names are; a context file is read back)."""
    return bool(worker) and "/" not in worker and worker not in (".", "..") and "\0" not in worker
