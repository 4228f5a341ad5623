"""Process-tree helpers for teardown (launcher side; uses psutil)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def processes_with_env(name: str, value: str, **also: str) -> list[int]:
    """PIDs of this user's processes whose environment has NAME=VALUE (and every KEY=VALUE of ``also``).

    The environment survives setsid and double forks, so it finds daemonized
    MPI daemons that left every process group we know of. ``also`` narrows
    the match: a worker's name is shared by every local job of the same
    ``--name``, its job's marker (``MPILAUNCH_JOB``) is not.
    """
    needles = {f"{name}={value}".encode(), *(f"{k}={v}".encode() for k, v in also.items())}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needles <= set(f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process and all its descendants; gone processes are fine."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def terminate_group(proc: subprocess.Popen, grace: float = 5.0) -> int:
    """SIGTERM ``proc``'s process group, SIGKILL it and ``proc``'s tree after ``grace``
    seconds; ``proc``'s exit status.

    ``proc`` is waited for through its own Popen, the one owner of its status:
    a caller blocked in ``wait_exit(proc)`` on another thread then reads the
    same code. (A wait by pid, psutil's, reaped the child behind the Popen's
    back, whose own wait then read 0: mpirun "succeeded" whenever mpilaunch
    stopped it.)
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.wait()  # nothing left of the group: the process has ended
    try:
        wait_exit(proc, grace)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what the group leader left behind
    except ProcessLookupError:
        pass
    return wait_killed(proc, "mpirun")


def end_leftover_group(pgid: int, grace: float = 1.0) -> None:
    """SIGTERM what is left of the process group ``pgid`` (its leader has ended and been waited
    for: Linux reuses no pid while it names a group), SIGKILL it after ``grace`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    until = time.monotonic() + grace
    while time.monotonic() < until:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` but its leader (Linux's /proc; none where there is none)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit() or int(name) == sid:
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue  # ended meanwhile
        fields = text[text.rfind(")") + 2 :].split()  # the command may hold spaces and parentheses
        if len(fields) > 3 and fields[3] == str(sid):  # state ppid pgrp session
            found.append(int(name))
    return found


def kill_session_leftovers(sid: int) -> None:
    """SIGKILL what is left of session ``sid`` once its leader has ended: the processes that made
    groups of their own in it (Open MPI's mpirun puts each rsh agent it starts in its own process
    group, so a group's kill misses them)."""
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


#: how long a SIGKILLed process may take to be gone: only one stuck in the kernel takes longer (state
#: D: a hung network filesystem or device driver; a frozen cgroup), and no signal ends it then
KILL_WAIT_S = 10.0


def wait_killed(proc: subprocess.Popen, what: str) -> int:
    """``proc``'s exit status once SIGKILL was sent, waited for no longer than KILL_WAIT_S.

    Past that it is left behind, with a warning that says where it hangs, and
    its status reads as killed by SIGKILL: mpilaunch still reports and cleans
    up everything else instead of waiting for it forever.
    """
    try:
        return wait_exit(proc, KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    state = _proc_state(proc.pid)
    print(
        f"mpilaunch: warning: {what} (pid {proc.pid}) is still there {KILL_WAIT_S:g} s after SIGKILL "
        f"(state {state}: stuck in the kernel, a hung filesystem or device, or a frozen cgroup); "
        "mpilaunch goes on without it",
        file=sys.stderr,
        flush=True,
    )
    return -signal.SIGKILL


def _proc_state(pid: int) -> str:
    """The state letter and kernel wait channel of ``pid`` (``D in nfs_wait``), or ``?``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "?"
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    return f"{state} in {wchan}" if wchan not in ("", "0") else state


def forward_signals_to_group(pgid: int) -> None:
    """Relay SIGTERM/SIGINT/SIGHUP to a process group (an in-cluster launcher's mpirun)."""

    def forward(signum, _frame):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)


def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    """``proc.wait(timeout)``, woken by the exit itself.

    subprocess's own timed wait polls with sleeps growing to 50 ms, so an exit
    is noticed up to 50 ms late, on every launch. A pidfd becomes readable at
    the exit. Raises subprocess.TimeoutExpired like ``Popen.wait``.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # kernel < 5.3, or already reaped
        return proc.wait(timeout=timeout)
    try:
        readable, _, _ = select.select([pidfd], [], [], max(0.0, timeout))
    finally:
        os.close(pidfd)
    if not readable:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()
