"""Per-rank wrapper: ``python -m mpilaunch.rank [--bind-gpus] [--attempt N] [--linger-ms N] -- CMD...``.

(``python -m mpilaunch.rank --task-starter ...``: a PS task's starter, ``task_starter.py``.)

mpirun starts this in place of the user's program on every rank. It prints
one start line on stderr (rank, local rank, size, worker, host: what mpilaunch
checks against the plan), runs the program, forwards termination signals to
it, and prints one status line on stderr that the launcher reads from
mpirun's tagged output. That is how mpilaunch knows *where* every rank runs
and *which* rank failed, on which worker, with which exit code, for every MPI
flavour alike (mpirun's own exit code and messages differ).
Those lines end in ``token=T``: a random token mpilaunch makes per launch and
passes in ``MPILAUNCH_STATUS_TOKEN``, which the wrapper takes out of the
program's environment. mpilaunch counts only lines with its token, so a
program that prints such a line (or cats an old log) cannot forge a rank's
exit or start.
Standard library only, and few modules of it: one of these starts per
rank, so the program is started with ``os.posix_spawn`` (no ``subprocess``),
signals come from ``_signal`` (no ``enum``), and ``re`` is imported only by
the parsers, which run in mpilaunch itself.
"""

from __future__ import annotations

# The C half of ``signal``: the same functions and numbers without the enum
# module the Python half builds its Signals class with (~8 ms of every rank's
# start, as much as the rest of the wrapper).
import _signal as signal
import os
import sys
import time

from .core import env_names, rank_env
from .core.rank_lines import (
    LOCAL_RANK_VARS,
    RANK_VARS,
    SIZE_VARS,
    first_env,
    format_env,
    format_mpi,
    format_start,
    format_status,
)

# How long the wrapper looks for the MPI library the program loads (most load
# it within their first second); a program without MPI is looked at this long.
MPI_WATCH_S = 120.0
MPI_WATCH_MAX_INTERVAL_S = 1.0
# --linger-ms N: after its status line, the wrapper stays until the daemon has
# read its pipe, at most N ms (Open MPI's daemons can drop a reaped process's
# last output; mpi.openmpi.LINGER_MS says when and how long).
_FIONREAD = 0x541B  # termios.FIONREAD on Linux; not importing termios keeps the start light


def bound_devices(environ) -> str | None:
    """--bind-gpus: local rank i sees only the i-th GPU of its worker."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    local = first_env(LOCAL_RANK_VARS, environ)
    if not visible or local is None:
        return None
    devices = [d for d in visible.split(",") if d]
    return devices[int(local) % len(devices)] if devices else None


def program_env(environ, bind: bool, attempt: str = "1") -> dict:
    """The user program's environment: its worker's PATH, MPI's library directory first, its own GPU
    with --bind-gpus, torch.distributed's rendezvous variables, and MPILAUNCH_ATTEMPT, which run of
    the job this is (2 and up: relaunched by --retries)."""
    env = dict(environ)
    env.pop(env_names.STATUS_TOKEN, None)  # the wrapper's alone: a program that knew it could forge its rank's exit
    env[env_names.ATTEMPT] = attempt
    rank_env.restore_worker_path(env)
    env.update(
        rank_env.torch_env(env, first_env(RANK_VARS, env), first_env(LOCAL_RANK_VARS, env), first_env(SIZE_VARS, env))
    )
    libdir = env.pop(env_names.MPI_LIBDIR, "")  # mpi.LIBDIR_ENV: Intel MPI's <prefix>/lib
    if libdir:  # once: -x LD_LIBRARY_PATH=$VENV/lib (impi-rt's libdir) stays as it was sent
        env["LD_LIBRARY_PATH"] = rank_env.with_directory_first(env.get("LD_LIBRARY_PATH"), libdir)
    if bind:
        device = bound_devices(env)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
    return env


#: hang/site: the sitecustomize that arms the stacks handler the hang probe falls back on (no py-spy)
STACKS_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang", "site")


def with_stacks_site(pythonpath: str | None) -> str:
    """``pythonpath`` with mpilaunch's stacks sitecustomize first (it runs the one it hides).

    Every program gets it, not only one that is ``python``: a shell script
    that runs Python is a Python rank too, and a program that is not Python
    never reads it."""
    return STACKS_SITE + (os.pathsep + pythonpath if pythonpath else "")


def memory_cgroup_file(cgroups: str, mountinfo: str) -> str | None:
    """The file whose ``oom_kill`` line counts OOM kills in this process's memory cgroup.

    ``cgroups``: /proc/self/cgroup; ``mountinfo``: /proc/self/mountinfo. The
    cgroup's path is relative to the mount's root (a container sees its own
    cgroup as the root). cgroup v1: ``memory.oom_control``; v2:
    ``memory.events``. None without a mounted memory cgroup.
    """
    v1 = v2 = None
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = path
        elif controllers == "":
            v2 = path
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, mount_point = fields[3], fields[4]
        fstype, _, options = line.split(" - ", 1)[1].partition(" ")
        if fstype == "cgroup" and v1 is not None and "memory" in options.split()[-1].split(","):
            path, name = v1, "memory.oom_control"
        elif fstype == "cgroup2" and v2 is not None and v1 is None:
            path, name = v2, "memory.events"
        else:
            continue
        relative = path[len(root) :] if path.startswith(root) else path
        return os.path.join(mount_point, relative.lstrip("/"), name)
    return None


def oom_kills(path: str | None) -> int | None:
    """The OOM kill count in that file, None when it cannot be read (no cgroup, old kernel)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed under us: the start line says nothing of it
        return None


#: ``python -m mpilaunch.rank --task-starter ...`` runs ``mpilaunch.task_starter`` instead
TASK_STARTER = "--task-starter"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [TASK_STARTER]:
        # a PS task's starter: every backend says how a worker starts this module (its rank_prefix),
        # so the task starter needs no way of its own into the worker
        from .task_starter import main as start_task

        return start_task(argv[1:])
    bind = False
    linger_s = 0.0
    attempt = "1"
    worker_cwd = False
    while argv and argv[0] != "--":
        option = argv.pop(0)
        if option == "--bind-gpus":
            bind = True
        elif option == "--worker-cwd":
            worker_cwd = True
        elif option == "--attempt" and argv:
            attempt = argv.pop(0)
        elif option == "--linger-ms" and argv:
            linger_s = int(argv.pop(0)) / 1000
    command = argv[1:]
    token = os.environ.get(env_names.STATUS_TOKEN)
    env = program_env(os.environ, bind, attempt)
    cwd = env.pop(rank_env.WORKER_CWD_ENV, None)
    if worker_cwd and cwd:
        try:
            os.chdir(cwd)  # the worker's own directory: the program starts where it would under ssh
        except OSError:
            pass
    rank = first_env(RANK_VARS, env) or "?"
    worker = env.get(env_names.WORKER, "?")
    program = rank_env.resolve_program(command[0], env.get("PATH", "")) if command else None
    print(format_start(env, rank_env.reported_program(program, env), token, _cwd()), file=sys.stderr, flush=True)
    changed = rank_env.changed_forwarded(env)
    if changed:
        print(format_env(rank, worker, changed, token), file=sys.stderr, flush=True)
    # after the environment check: the program's PYTHONPATH is the user's in the digest
    env["PYTHONPATH"] = with_stacks_site(env.get("PYTHONPATH"))
    # A rank SIGKILLed while its cgroup's OOM kill count went up was killed for
    # memory: the summary says so instead of a bare "exit 137".
    oom_file = memory_cgroup_file(_read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
    oom_before = oom_kills(oom_file)
    try:
        # Every descriptor is inherited: MPICH's PMI hands each rank its
        # connection as one (PMI_FD); closing it breaks MPI_Init. Python
        # ignores SIGPIPE and SIGXFSZ; the program gets the defaults back.
        if command and program is None:  # not on the program's PATH (execvp's own search used ours)
            raise FileNotFoundError(2, "No such file or directory")
        pid = os.posix_spawn(program, command, env, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except (OSError, IndexError) as e:
        what = repr(command[0]) if command else "a program (none given after --)"
        why = getattr(e, "strerror", None) or "empty command"
        print(f"mpilaunch: error: rank {rank}: cannot start {what}: {why}", file=sys.stderr)
        print(format_status(rank, worker, 127, token=token), file=sys.stderr, flush=True)
        return 127

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    library = watch_mpi_library(pid, MPI_WATCH_S)
    if library is not None:
        print(format_mpi(rank, worker, library, token), file=sys.stderr, flush=True)
    _, status = os.waitpid(pid, 0)  # retried after a forwarded signal (PEP 475)
    code = (
        -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    )  # 3.8 has no waitstatus_to_exitcode
    oom = code == -signal.SIGKILL and oom_before is not None and (oom_kills(oom_file) or 0) > oom_before
    if code < 0:
        code = 128 - code
    print(format_status(rank, worker, code, oom, token), file=sys.stderr, flush=True)
    if linger_s:
        wait_until_read(2, linger_s)
    return code


def watch_mpi_library(pid: int, limit_s: float) -> str | None:
    """The MPI library ``pid`` loads (its path), looked for in its maps until it exits or ``limit_s``.

    Looks often at first (most programs load MPI early) and then at most
    once a second; waits on a pidfd so that an exit ends the watch at once.
    """
    try:
        import select

        pidfd = os.pidfd_open(pid)
    except (ImportError, AttributeError, OSError):
        return None  # no pidfd (old kernel): no check rather than a slower exit
    try:
        deadline = time.monotonic() + limit_s
        interval = 0.005
        while time.monotonic() < deadline:
            if select.select([pidfd], [], [], interval)[0]:
                return None  # exited (a library loaded in its last moments is not worth a read)
            library = rank_env.mpi_library(_read(f"/proc/{pid}/maps"))
            if library is not None:
                return library
            interval = min(interval * 2, MPI_WATCH_MAX_INTERVAL_S)
        return None
    finally:
        os.close(pidfd)


def unread_bytes(fd: int) -> int:
    """Bytes written to the pipe at ``fd`` that its reader has not read yet."""
    import fcntl
    import struct

    return struct.unpack("i", fcntl.ioctl(fd, _FIONREAD, b"\0\0\0\0"))[0]


def wait_until_read(fd: int, limit_s: float) -> None:
    """Stay alive until the daemon has read our last line (--linger-ms), at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if unread_bytes(fd) == 0:
                return
        except OSError:  # not a pipe: nothing tells when it was read
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        time.sleep(0.001)


if __name__ == "__main__":
    sys.exit(main())
