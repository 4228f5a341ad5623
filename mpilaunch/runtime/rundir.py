"""Per-job run directories in $TMPDIR: made private, owned, and swept when their owner is gone.

A run directory holds a job's secret, context file, hostfile, shim launcher
and (Kubernetes) credential copies. mpilaunch removes its own on every exit
path it runs; one that was SIGKILLed runs none, so each directory names its
owner process and the next mpilaunch removes those whose owner is dead.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def make_rundir(job_name: str) -> Path:
    """Private per-job directory: secret, context file, hostfile, shim launcher.

    It names its owner (this process: ``OWNER_FILE``), and the run
    directories of owners that are gone (a SIGKILLed mpilaunch: no finally
    ran; they hold its secret and the k8s backend's credential copies) are
    removed first (``sweep_stale_rundirs``).
    """
    sweep_stale_rundirs()
    rundir = Path(tempfile.mkdtemp(prefix=f"mpilaunch-{job_name}-"))
    os.chmod(rundir, 0o700)
    write_owner(rundir)
    return rundir


#: in a run directory: who made it (``owner_record``); the sweep removes only directories that have one
OWNER_FILE = ".mpilaunch-owner"
_OWNER_MAGIC = "mpilaunch-rundir-owner v1"


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def process_start_time(pid: int) -> str | None:
    """When ``pid`` started (/proc/PID/stat field 22, clock ticks since boot): a pid reused by another
    process has another one. None when there is no such process (or no /proc)."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name before ")" may hold spaces
    return fields[19] if len(fields) > 19 else None


def _identity() -> tuple[str, str]:
    """This machine's boot and pid namespace: a pid means the same process only within both."""
    boot = (_read_text("/proc/sys/kernel/random/boot_id") or "?").strip()
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = "?"
    return boot, pidns


def owner_record(pid: int) -> str:
    boot, pidns = _identity()
    return f"{_OWNER_MAGIC}\npid={pid}\nstart={process_start_time(pid) or '?'}\nboot={boot}\npidns={pidns}\n"


def write_owner(rundir: Path) -> None:
    """Name this process as the run directory's owner (written whole: a reader sees all of it or nothing)."""
    tmp = rundir / (OWNER_FILE + ".tmp")
    tmp.write_text(owner_record(os.getpid()))
    os.replace(tmp, rundir / OWNER_FILE)


def parse_owner(record: str | None) -> dict[str, str] | None:
    """An owner file's fields (``owner_record``: pid, start, boot, pidns); None for anything else
    (empty, partly written, not an owner file, unreadable: ``record`` None)."""
    lines = (record or "").splitlines()
    if not lines or lines[0] != _OWNER_MAGIC:
        return None
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def owner_gone(record: str, identity: tuple[str, str] | None = None) -> bool:
    """True only when the owner file says for sure that its process is dead: same boot and pid
    namespace as ours, and no process with its pid, or one that started at another time (reused).
    The sweep's question (it removes only what is surely dead); whether a run directory's job runs
    is ``owner_alive``'s, not the opposite of this."""
    fields = parse_owner(record)
    if fields is None:
        return False
    identity = identity or _identity()
    pid, start = fields.get("pid", ""), fields.get("start", "?")
    if not pid.isdigit() or "?" in identity or (fields.get("boot"), fields.get("pidns")) != identity:
        return False  # another machine's or container's process (a shared /tmp), or nothing to compare
    if int(pid) == os.getpid():
        return False
    now = process_start_time(int(pid))
    if now is None:
        return not os.path.exists(f"/proc/{pid}")  # unreadable but there: alive, as far as we know
    return start != "?" and now != start


def owner_alive(record: str | None, identity: tuple[str, str] | None = None, start_of=None) -> bool:
    """True only when the owner file says for sure that its process runs: a whole record of this
    boot and pid namespace whose pid's process started when the record says (not a pid reused).
    An empty, partly written or unreadable record (None), another machine's or container's, or one
    without a start time is not alive: ``mpilaunch stacks`` acts only on a job that surely runs.
    ``start_of``: pid -> its start time (``process_start_time``)."""
    fields = parse_owner(record)
    if fields is None:
        return False
    identity = identity or _identity()
    pid, start = fields.get("pid", ""), fields.get("start", "?")
    if not pid.isdigit() or start == "?" or "?" in identity:
        return False
    if (fields.get("boot"), fields.get("pidns")) != identity:
        return False
    return (start_of or process_start_time)(int(pid)) == start


# ------------------------------------------------- run directories found by name (`mpilaunch stacks`)
#
# $TMPDIR is usually /tmp, where every local user may create ``mpilaunch-<job>-*``: a run
# directory found by name counts only when it is surely this user's own, made by make_rundir
# (mode 700, owned by us), looked at without following a link, and read through a descriptor of
# the very directory checked (no other user can then put anything in it).


def is_own_rundir(st: os.stat_result, uid: int) -> bool:
    """Whether ``st`` (an ``lstat``, or an ``fstat`` of an O_NOFOLLOW descriptor) is a run directory
    of user ``uid``'s own: a directory, not a link to one, owned by ``uid``, mode 700 exactly."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700


def is_own_file(st: os.stat_result, uid: int) -> bool:
    """Whether ``st`` (``fstat`` of an O_NOFOLLOW descriptor) is a regular file owned by ``uid``."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid


def open_own_rundir(path: str, uid: int | None = None) -> int:
    """A descriptor of the run directory ``path`` when it is this user's own (``is_own_rundir``),
    checked before it is opened (``lstat``) and once opened (O_NOFOLLOW, ``fstat``: the same
    directory); PermissionError when it is not, OSError when it cannot be looked at."""
    uid = os.geteuid() if uid is None else uid
    if not is_own_rundir(os.lstat(path), uid):
        raise PermissionError(f"{path} is not a run directory of uid {uid}'s own (mode 700)")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not is_own_rundir(os.fstat(fd), uid):
            raise PermissionError(f"{path} changed while it was opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_own_file(dir_fd: int, name: str, uid: int | None = None, limit: int = 1 << 20) -> str:
    """The text of file ``name`` in the directory ``dir_fd`` (``open_own_rundir``), not through a
    link and only a regular file of this user's own; at most ``limit`` bytes."""
    uid = os.geteuid() if uid is None else uid
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not is_own_file(os.fstat(fd), uid):
            raise PermissionError(f"{name} is not a regular file of uid {uid}'s own")
        return f.read(limit).decode()


def sweep_stale_rundirs(tmpdir: str | None = None) -> list[str]:
    """Remove the run directories (``$TMPDIR/mpilaunch-*`` of this user) whose owner process is gone.

    Only directories with an owner file count: a job's run directory names
    its mpilaunch, an agent's private directory (``mpilaunch-<worker>-XXXX``,
    its ranks' TMPDIR) the agent; a live one's owner is alive. Never fails a
    launch: what cannot be read is left alone.
    """
    base = tmpdir or tempfile.gettempdir()
    removed = []
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith("mpilaunch-")]
    except OSError:
        return removed
    uid, identity = os.getuid(), _identity()
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or st.st_uid != uid:
                continue
            fd = os.open(os.path.join(entry.path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                record = f.read(4096)
        except (OSError, ValueError):
            continue
        if owner_gone(record, identity):
            remove_tree(Path(entry.path))
            removed.append(entry.path)
    return removed


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
