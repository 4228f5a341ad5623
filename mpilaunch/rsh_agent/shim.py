"""``mpilaunch-rsh``: the rsh/ssh agent that mpirun runs once per worker.

    mpilaunch-rsh [ssh-like options] HOST WORD...

Open MPI passes the daemon command as several shell-quoted words, MPICH
hydra as one or more words, Intel MPI adds ssh options (``-x``, ``-q``,
``-o X`` ...) in front.  Like ssh, the words are joined with spaces and the
remote side runs them with ``/bin/sh -c``.  The worker is looked up in the
job's context file (``$MPILAUNCH_CONTEXT``) and reached through the
transport it names; the remote exit status becomes ours, 255 when the
connection fails.

Hot path: mpirun may start hundreds of these at once, so this module and
everything it imports use only built-in or C stdlib modules (no ``json``:
the context is parsed by a small JSON reader that falls back to ``json``).
"""

from __future__ import annotations

import os
import sys

from ..core import env_names

PROG = "mpilaunch-rsh"
CONTEXT_ENV = env_names.CONTEXT
# Run on the worker before the daemon command: the worker's PATH as it is
# before Open MPI's implied --prefix puts mpirun's bin directory ahead of it
# (the daemon command starts with "PATH=<prefix>/bin:$PATH"). The rank
# wrapper gives it back to the program (rank_env.restore_worker_path). Kept
# when the launcher sent one (local/YARN agents get this machine's PATH
# from before mpirun; mpi.WORKER_PATH_ENV).
CAPTURE_WORKER_PATH = (
    f': "${{{env_names.WORKER_PATH}:=$PATH}}"; export {env_names.WORKER_PATH}; '
    # and its directory, for a rank whose mpirun's is not there (rank --worker-cwd)
    f'{env_names.WORKER_CWD}="$PWD"; export {env_names.WORKER_CWD}; '
)


# A worker served by a spare (--spares: backends/spare_pool.py, whose SPARE_KEY this is): the
# spare's agent calls its sessions by the spare's own name; the ranks must say the plan's worker.
SPARE_KEY = "spare"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def remote_command(command: str, host: str | None = None, worker: dict | None = None) -> str:
    """The words the worker's ``/bin/sh -c`` runs: the captures, then mpirun's ``command``."""
    said = CAPTURE_WORKER_PATH
    if worker and worker.get(SPARE_KEY) and host and set(host) <= _NAME_CHARS:
        said += f"{env_names.WORKER}={host}; export {env_names.WORKER}; "
    return said + command


# ssh options that take a value (the value may be attached: -p22, -oX=Y).
_SSH_OPTS_WITH_VALUE = set("bcDEeFIiJLlmOopQRSWwB")
# ssh flags without a value; unknown ones are skipped too (they cannot take
# a value we know of, and failing the launch over a cosmetic flag helps no one).
_SSH_NO_STDIN = "n"


class ArgvError(Exception):
    """mpirun gave the shim arguments it cannot read (not core.errors.UsageError: the shim's own)."""


def parse_argv(argv):
    """Return ``(host, command, no_stdin)`` from the agent's arguments."""
    i = 0
    no_stdin = False
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        j = 1
        while j < len(arg):
            opt = arg[j]
            if opt in _SSH_OPTS_WITH_VALUE:
                if j + 1 == len(arg):  # value is the next argument
                    i += 1
                    if i >= len(argv):
                        raise ArgvError(f"option -{opt} needs a value")
                break
            if opt == _SSH_NO_STDIN:
                no_stdin = True
            j += 1
        i += 1
    rest = argv[i:]
    if len(rest) < 2:
        raise ArgvError("usage: mpilaunch-rsh [options] HOST COMMAND...")
    host = rest[0].rpartition("@")[2]  # ssh's user@host
    return host, " ".join(rest[1:]), no_stdin


# --- tiny JSON reader (saves importing json -> re, enum on every launch) ------

_WS = " \t\n\r"
_ESC = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUM_CHARS = set("+-0123456789.eE")


def _skip(s, i):
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _value(s, i):
    i = _skip(s, i)
    c = s[i]
    if c == "{":
        obj = {}
        i = _skip(s, i + 1)
        if s[i] == "}":
            return obj, i + 1
        while True:
            i = _skip(s, i)
            if s[i] != '"':
                raise ValueError("expected a key")
            key, i = _string(s, i + 1)
            i = _skip(s, i)
            if s[i] != ":":
                raise ValueError("expected ':'")
            obj[key], i = _value(s, i + 1)
            i = _skip(s, i)
            if s[i] == "}":
                return obj, i + 1
            if s[i] != ",":
                raise ValueError("expected ',' or '}'")
            i += 1
    if c == "[":
        arr = []
        i = _skip(s, i + 1)
        if s[i] == "]":
            return arr, i + 1
        while True:
            item, i = _value(s, i)
            arr.append(item)
            i = _skip(s, i)
            if s[i] == "]":
                return arr, i + 1
            if s[i] != ",":
                raise ValueError("expected ',' or ']'")
            i += 1
    if c == '"':
        return _string(s, i + 1)
    for word, val in (("true", True), ("false", False), ("null", None)):
        if s.startswith(word, i):
            return val, i + len(word)
    j = i
    while j < len(s) and s[j] in _NUM_CHARS:
        j += 1
    text = s[i:j]
    if not text:
        raise ValueError("unexpected character")
    return (float(text) if any(x in text for x in ".eE") else int(text)), j


def _string(s, i):
    parts = []
    while True:
        j = i
        while s[j] != '"' and s[j] != "\\":
            if s[j] < " ":
                raise ValueError("control character in string")
            j += 1
        parts.append(s[i:j])
        if s[j] == '"':
            return "".join(parts), j + 1
        esc = s[j + 1]
        if esc == "u":
            code = int(s[j + 2 : j + 6], 16)
            i = j + 6
            if 0xD800 <= code < 0xDC00 and s.startswith("\\u", i):
                low = int(s[i + 2 : i + 6], 16)
                if 0xDC00 <= low < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
            parts.append(chr(code))
        else:
            parts.append(_ESC[esc])
            i = j + 2


def loads_json(text: str):
    """Parse JSON; anything this reader does not accept goes to ``json``."""
    try:
        value, end = _value(text, 0)
        if _skip(text, end) == len(text):
            return value
    except (ValueError, IndexError, KeyError):
        pass
    import json  # slow path: exact errors (and any corner case we do not handle)

    return json.loads(text)


def load_context(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        context = loads_json(f.read())
    if not isinstance(context, dict):
        raise ValueError("context must be a JSON object")
    return context


def _error(message: str) -> int:
    try:
        os.write(2, f"{PROG}: error: {message}\n".encode("utf-8", "replace"))
    except OSError:
        pass
    return 255


def load_transport(name: str):
    """A context's transport: a module of rsh_agent/transports by its short name ("agent"), or
    a backend's own by its full name ("mpilaunch.backends.k8s.exec_path.transport")."""
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"bad transport name {name!r}")
    module = name if "." in name else f"mpilaunch.rsh_agent.transports.{name}"
    __import__(module)
    return sys.modules[module]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        host, command, no_stdin = parse_argv(argv)
    except ArgvError as exc:
        return _error(str(exc))
    path = os.environ.get(CONTEXT_ENV)
    if not path:
        return _error(f"${CONTEXT_ENV} is not set; mpilaunch-rsh runs under mpilaunch only")
    status = _run(path, host, command, no_stdin)
    if status != 0:
        record_exit(path, host, status)
    return status


def _run(path: str, host: str, command: str, no_stdin: bool) -> int:
    try:
        context = load_context(path)
    except (OSError, ValueError) as exc:
        return _error(f"cannot read context {path}: {exc}")
    workers = context.get("workers") or {}
    worker = workers.get(host)
    if worker is None:
        known = ", ".join(sorted(workers)) or "none"
        return _error(f"unknown worker '{host}' (known: {known})")
    try:
        transport = load_transport(context.get("transport") or "agent")
    except (ImportError, ValueError) as exc:
        return _error(f"cannot load transport {context.get('transport')!r}: {exc}")
    if no_stdin:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    try:
        status = transport.run(context, worker, remote_command(command, host, worker))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, KeyError) as exc:  # AgentError is a ConnectionError
        return _error(f"{host}: {exc}")
    return status if 0 <= status <= 255 else 255


# --- failed daemons, for mpilaunch to see ---------------------------------------
#
# Open MPI fails a launch when an agent it keeps attached exits non-zero.
# MPICH's and Intel MPI's hydra do not look at their launcher's exit: a proxy
# that dies before it connects back (it cannot resolve the launcher's name,
# its worker is gone) leaves mpiexec waiting for it forever. So every agent
# that ends non-zero leaves a note next to the job's context file, and
# mpilaunch ends an mpirun that goes on waiting (workloads/mpirun.py).

EXITS_DIR = "agent-exits"


def record_exit(context_path: str, host: str, status: int) -> None:
    directory = os.path.join(os.path.dirname(os.path.abspath(context_path)), EXITS_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, f"{os.getpid()}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{status} {host}\n".encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass  # best effort: the job's --timeout still bounds it


def uses_agents(context_path) -> bool:
    """Whether the job's shims reach mpilaunch's agents, which end a session's processes when its
    shim's connection drops (a SIGKILLed shim leaves nothing running); an exec-API stream that is
    cut leaves its command running in the pod."""
    try:
        with open(context_path, encoding="utf-8") as f:
            return (loads_json(f.read()).get("transport") or "agent") == "agent"
    except (OSError, ValueError, AttributeError):
        return False


def failed_agents(rundir: str) -> list[tuple[str, int]]:
    """``(worker, exit code)`` of every agent of the job that ended non-zero so far, earliest first."""
    directory = os.path.join(rundir, EXITS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                code, _, host = f.read().strip().partition(" ")
                written = os.fstat(f.fileno()).st_mtime_ns
            out.append((written, host, int(code)))
        except (OSError, ValueError):
            continue  # being written
    return [(host, code) for _, host, code in sorted(out)]  # the first to fail first


# --- fast launcher ------------------------------------------------------------------


def write_launcher(path: str, python: str | None = None) -> str:
    """Write an executable ``mpilaunch-rsh`` that starts Python with ``-I -S`` (see ``pylauncher``).

    Point mpirun's rsh agent at the returned path when launch latency matters.
    """
    from ..core.pylauncher import write_launcher as write

    return write(path, "mpilaunch.rsh_agent.shim", python)


if __name__ == "__main__":
    sys.exit(main())
