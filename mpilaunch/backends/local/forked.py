"""Local agents forked from the launcher process instead of started as interpreters of their own.

The local backend forks each worker's agent from mpilaunch itself (which has
imported the agent's modules once): the child sheds the launcher's signal
handlers, descriptors and environment and runs ``mpilaunch agent``'s ``main``
as an exec'd agent would. ``ForkedAgent`` is what the backend and ``procs``
use of ``subprocess.Popen``.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import select
import signal
import subprocess
import sys

from ...core import env_names
from ...core.exit_codes import EXIT_FAILED

# From this many workers on (every job, by default), agents are forked from this process
# instead of started as interpreters of their own (``ForkedAgent``). An exec'd agent's start
# is a Python start-up plus its imports, ~30 ms of CPU, and the machine's cores run them all
# beside the launch. Forked from this process (which imports the agent's modules once) an
# agent costs ~0.5-1 ms. BSD process accounting, 256 workers x `true`, 2-core VM: exec'd
# agents 7.85 of the launch's 23.3 CPU-seconds (30.7 ms each), forked 0.13-0.20 s (0.5-0.8 ms
# each) plus ~0.3 s more in this process; bench_scale at 256 workers, interleaved, medians of
# 3 against the same floor: Open MPI 4 17.5 s -> 14.0 s (1.62x -> 1.30x the floor), Open MPI
# 5 15.4 s -> 9.9 s (2.54x -> 1.64x). At 2 workers (bench_e2e) it is 10-15 ms of a 0.17 s
# launch. The price: `ps` shows a forked agent with this process's command line (its comm is
# "mpilaunch.agent", its stdout the worker's ``<worker>.agent.log``). The environment
# variable is for measuring (bench_scale --variant) and for turning it off.
FORK_AGENTS_FROM = int(os.environ.get(env_names.LOCAL_FORK_FROM, "1"))


class ForkedAgent:
    """An agent forked from this process: what the backend and ``procs`` use of ``subprocess.Popen``."""

    def __init__(self, pid: int, args: list[str]):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def _reaped(self, flags: int) -> int | None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its code is lost
            self.returncode = self.returncode if self.returncode is not None else 255
            return self.returncode
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._reaped(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if timeout is not None:
            with _pidfd(self.pid) as fd:
                if fd is not None and not select.select([fd], [], [], max(0.0, timeout))[0]:
                    raise subprocess.TimeoutExpired(self.args, timeout)
        return self._reaped(0)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@contextlib.contextmanager
def _pidfd(pid: int):
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def run_forked_agent(argv: list[str], env: dict, listen_fd: int, log_fd: int) -> None:
    """In the forked child: become a worker's agent as its own interpreter would, then leave."""
    code = EXIT_FAILED
    try:
        gc.freeze()  # the parent's objects: never scanned here, so their pages stay shared
        os.setsid()
        for sig in signal.valid_signals():  # the launcher's handlers (Ctrl-C -> release) are not the agent's
            try:
                handler = signal.getsignal(sig)
                if callable(handler) and handler is not signal.default_int_handler:
                    signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        # out of 0-3 first (a launcher started with stdio closed has its sockets there), then in
        listen_fd, log_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (listen_fd, log_fd))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.dup2(listen_fd, 3)
        _close_fds_from(4)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        os.environ.clear()
        os.environ.update(env)
        _set_comm(b"mpilaunch.agent")
        from ...agent.cli import main

        result = main(argv)
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # whatever it was, the log says it and the agent ends
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _close_fds_from(low: int) -> None:
    """Close every descriptor from ``low`` on: the launcher's (other workers' sockets, mpirun's
    pipes) are not the agent's; an agent holding one would keep it open past the launch."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: as far as the usual limit
        fds = range(low, 1 << 16)
    for fd in fds:
        if fd >= low:
            try:
                os.close(fd)
            except OSError:
                pass


def _set_comm(name: bytes) -> None:
    """The process's name in ``ps -e``/``top`` (what prctl PR_SET_NAME sets; best effort).
    Written to /proc rather than through ctypes, whose import costs each agent ~3 ms."""
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(name[:15])
    except OSError:
        pass
