"""Process-tree helpers for the agent: pure reads of /proc, and signals that
tolerate a process vanishing under them. A session's members are found by the
MPILAUNCH_SESSION marker in their environment, which survives setsid and
double forks (the process group does not)."""

import ctypes
import os

from .constants import SESSION_ENV

_SESSION_MARK = SESSION_ENV.encode() + b"="

PR_SET_PDEATHSIG = 1

PR_SET_CHILD_SUBREAPER = 36


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _children_via_task_files(pid: int):
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in tids:
        kids.extend(int(x) for x in _read(f"/proc/{pid}/task/{tid}/children").split())
    return kids


def _parent_map():
    """pid -> ppid for every process (fallback when task/children is missing)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            fields = stat.rpartition(b")")[2].split()
            if len(fields) > 1:
                parents[int(entry)] = int(fields[1])
    return parents


_HAS_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def descendants(root: int) -> list:
    """Every live descendant of ``root`` (children files, else a /proc scan)."""
    if _HAS_CHILDREN_FILES:
        found, todo = [], [root]
        while todo:
            kids = _children_via_task_files(todo.pop())
            found.extend(kids)
            todo.extend(kids)
        return found
    children = {}
    for pid, ppid in _parent_map().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def session_marker(pid: int):
    """The MPILAUNCH_SESSION value in a process's environment, or None."""
    for item in _read(f"/proc/{pid}/environ").split(b"\0"):
        if item.startswith(_SESSION_MARK):
            return item[len(_SESSION_MARK) :].decode("ascii", "replace")
    return None


def processes_by_session(root: int) -> dict:
    """session id -> [pid, ...] over the live descendants of ``root``."""
    result = {}
    for pid in descendants(root):
        sid = session_marker(pid)
        if sid is not None:
            result.setdefault(sid, []).append(pid)
    return result


def prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def killpg_quietly(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    stat = _read(f"/proc/{pid}/stat")
    state = stat.rpartition(b")")[2].split()[:1]
    return state == [b"Z"] or not stat
