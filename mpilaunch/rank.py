"""Per-rank wrapper: ``python -m mpilaunch.rank [--bind-gpus] [--attempt N] [--linger-ms N] -- CMD...``.

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

import os
import sys
import time

# The C half of ``signal``: the same functions and numbers without the enum
# module the Python half builds its Signals class with (~8 ms of every rank's
# start, as much as the rest of the wrapper).
import _signal as signal

from . import rank_env

STATUS_PREFIX = "mpilaunch-rank-status:"
START_PREFIX = "mpilaunch-rank-start:"
MPI_PREFIX = "mpilaunch-rank-mpi:"
ENV_PREFIX = "mpilaunch-rank-env:"
#: the per-launch token (``new_token``); the program never sees it (``program_env``)
TOKEN_ENV = "MPILAUNCH_STATUS_TOKEN"
# How long the wrapper looks for the MPI library the program loads (most load
# it within their first second); a program without MPI is looked at this long.
MPI_WATCH_S = 120.0
MPI_WATCH_MAX_INTERVAL_S = 1.0
UNKNOWN = "?"  # a value the rank's environment does not give
# Not under any worker's agent or pod: mpirun forked the rank next to itself.
NO_WORKER = UNKNOWN
# --linger-ms N: after its status line, the wrapper stays until the daemon has
# read its pipe, at most N ms (Open MPI's daemons can drop a reaped process's
# last output; mpi.openmpi.LINGER_MS says when and how long).
_FIONREAD = 0x541B  # termios.FIONREAD on Linux; not importing termios keeps the start light

_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


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

    m = re.search(re.escape(STATUS_PREFIX) + _STATUS_PATTERN + "(?:" + re.escape(OOM_MARK) + ")?"
                  + _token_pattern(token), text)
    if m is None:
        return None
    return int(m[1]), m[2], int(m[3])


def format_start(environ, program: str | None = None, token: str | None = None) -> str:
    """The start line: where this rank runs, as MPI and the worker's agent/pod tell it, the program
    its PATH resolved and a digest of the variables mpilaunch forwarded (the environment check)."""
    rank = first_env(_RANK_VARS, environ) or UNKNOWN
    local = first_env(_LOCAL_RANK_VARS, environ) or UNKNOWN
    size = first_env(_SIZE_VARS, environ) or UNKNOWN
    worker = environ.get("MPILAUNCH_WORKER") or NO_WORKER
    host = os.uname().nodename or UNKNOWN
    return (f"{START_PREFIX} rank={rank} local={local} size={size} worker={worker} host={host} "
            f"program={rank_env.quote(program) if program else UNKNOWN} env={rank_env.forwarded_digest(environ)}"
            + _signed(token))


_START_PATTERN = r" rank=(\d+) local=(\d+|\?) size=(\d+|\?) worker=(\S+) host=(\S+)"
_START_ENV_PATTERN = r" program=(\S+) env=([0-9a-f]{8})"


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
    if START_PREFIX not in text:
        return None
    import re

    env_fields = _START_ENV_PATTERN + _token_pattern(token) if token else f"(?:{_START_ENV_PATTERN})?"
    m = re.search(re.escape(START_PREFIX) + _START_PATTERN + env_fields, text)
    if m is None:
        return None
    number = lambda v: None if v == UNKNOWN else int(v)  # noqa: E731
    program = None if m[6] in (None, UNKNOWN) else rank_env.unquote(m[6])
    return (int(m[1]), number(m[2]), number(m[3]), m[4], m[5]), program, m[7]


def parse_start(text: str, token: str | None = None) -> tuple[int, int | None, int | None, str, str] | None:
    """The start line -> (rank, local rank, size, worker, host); unknown numbers are None."""
    parsed = parse_start_line(text, token)
    return None if parsed is None else parsed[0]


def bound_devices(environ) -> str | None:
    """--bind-gpus: local rank i sees only the i-th GPU of its worker."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    local = first_env(_LOCAL_RANK_VARS, environ)
    if not visible or local is None:
        return None
    devices = [d for d in visible.split(",") if d]
    return devices[int(local) % len(devices)] if devices else None


def program_env(environ, bind: bool, attempt: str = "1") -> dict:
    """The user program's environment: its worker's PATH, MPI's library directory first, its own GPU
    with --bind-gpus, torch.distributed's rendezvous variables, and MPILAUNCH_ATTEMPT, which run of
    the job this is (2 and up: relaunched by --retries)."""
    env = dict(environ)
    env.pop(TOKEN_ENV, None)  # the wrapper's alone: a program that knew it could forge its rank's exit
    env["MPILAUNCH_ATTEMPT"] = attempt
    rank_env.restore_worker_path(env)
    env.update(rank_env.torch_env(env, first_env(_RANK_VARS, env), first_env(_LOCAL_RANK_VARS, env),
                                  first_env(_SIZE_VARS, env)))
    libdir = env.pop("MPILAUNCH_MPI_LIBDIR", "")  # mpi.LIBDIR_ENV: Intel MPI's <prefix>/lib
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
        relative = path[len(root):] if path.startswith(root) else path
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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    token = os.environ.get(TOKEN_ENV)
    env = program_env(os.environ, bind, attempt)
    cwd = env.pop(rank_env.WORKER_CWD_ENV, None)
    if worker_cwd and cwd:
        try:
            os.chdir(cwd)  # the worker's own directory: the program starts where it would under ssh
        except OSError:
            pass
    rank = first_env(_RANK_VARS, env) or "?"
    worker = env.get("MPILAUNCH_WORKER", "?")
    program = rank_env.resolve_program(command[0], env.get("PATH", "")) if command else None
    print(format_start(env, rank_env.reported_program(program, env), token), file=sys.stderr, flush=True)
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
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)  # 3.8 has no waitstatus_to_exitcode
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
