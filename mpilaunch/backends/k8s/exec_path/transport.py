"""Transport through the Kubernetes exec API: what the shim (``mpilaunch-rsh``) runs per daemon.

One shim = one exec session: through the job's exec relay (:mod:`.relay`, a
unix-socket round trip, the default with ``--launcher local``) or over a TLS
connection of its own to the API server (:mod:`.exec_stream`, the stdlib
websocket client), with no kubectl process and no client library per daemon.
Each worker entry of the context has ``pod``.

The remote command runs as ``setsid /bin/sh -c CMD`` and writes its process
id to a file first, so a signal to the shim (mpirun tearing down) becomes a
second, tiny exec that signals the remote process group: closing an exec
stream does not stop the remote process on every container runtime.
"""

import os

SIGNAL_GRACE = 3.0

# The remote side: run the command as the leader of a new session and
# record that leader's pid (= its process group) for the killer below.
# ``$1`` is a session id, ``$2`` the command.
# setsid(1) forks when its caller already leads a process group, which is
# how a real container runtime starts an exec'd process (kwok's local exec
# does not): without ``-w`` the fork's parent exits 0 at once, so every
# daemon's exit code was lost and mpirun never learnt that a daemon died;
# and the pid recorded outside was not the command's group. So: ``-w``
# (wait, pass the exit code on), and the pid is written by the shell that
# is the session leader itself. That shell stays until the command ends,
# then removes the pid file (pods kept one per daemon session in /tmp); it
# traps the forwarded signals with a no-op, so it outlives the command (whose
# handlers are the defaults again) and passes its exit code on (128+N after
# a signal). Without a usable setsid the wrapper's own pid is the group to
# signal (and its file stays: nothing is left to remove it).
_WRAPPER = (
    'f="${TMPDIR:-/tmp}/mpilaunch-$1.pid"; '
    "if command -v setsid >/dev/null 2>&1 && setsid -w true 2>/dev/null; then "
    """exec setsid -w /bin/sh -c 'trap : INT TERM HUP; echo $$ >"$0" 2>/dev/null; /bin/sh -c "$1"; r=$?; """
    """rm -f "$0"; exit $r' "$f" "$2"; fi; """
    'echo $$ >"$f" 2>/dev/null; exec /bin/sh -c "$2"'
)
# ``$1`` is the signal name, ``$2`` the session id.
_KILLER = (
    'f="${TMPDIR:-/tmp}/mpilaunch-$2.pid"; p=$(cat "$f" 2>/dev/null) && [ -n "$p" ] && '
    '{ kill -$1 -$p 2>/dev/null || kill -$1 $p 2>/dev/null; }; rm -f "$f"'
)


def wrapped(sid: str, command: str) -> list:
    """The exec argv for one daemon command (see _WRAPPER)."""
    return ["/bin/sh", "-c", _WRAPPER, "mpilaunch-rsh", sid, command]


def killer(signame: str, sid: str) -> list:
    return ["/bin/sh", "-c", _KILLER, "mpilaunch-kill", signame, sid]


def run(context: dict, worker: dict, command: str) -> int:
    """mpilaunch-rsh's entry: run ``command`` in the worker's pod."""
    if context.get("relay"):
        return run_via_relay(context["relay"], worker["pod"], command)
    return run_direct(context, worker, command)


def run_via_relay(path: str, pod: str, command: str) -> int:
    """Hand our stdin/stdout/stderr and the command to the job's relay; wait for the exit code.

    Costs a bare interpreter start and one unix-socket round trip: no ssl,
    no TLS handshake, no JSON (only C modules are imported here).
    """
    import _signal
    import _socket
    import sys

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ConnectionError(f"cannot reach the job's exec relay {path}: {exc.strerror}") from None
    no_stdin = not _fd_open(0)
    request = b"\0".join(
        [b"EXEC", pod.encode(), command.encode("utf-8", "surrogateescape"), b"0" if no_stdin else b"1"]
    )
    fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
    header = len(request).to_bytes(4, "big")
    sock.sendmsg(
        [header + request],
        [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)]
        if not no_stdin
        else [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds[4:])],
    )

    def relay_signal(signum, _frame):
        try:
            sock.sendall(b"SIG %d\n" % signum)
        except OSError:
            pass

    for signum in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(signum, relay_signal)
    reply = b""
    while not reply.endswith(b"\n"):
        try:
            chunk = sock.recv(64)
        except InterruptedError:
            continue
        if not chunk:
            break
        reply += chunk
    sock.close()
    try:
        return int(reply.strip())
    except ValueError:
        from .exec_stream import write_all

        write_all(2, b"mpilaunch-rsh: the exec relay went away\n")
        return 255


def _fd_open(fd: int) -> bool:
    """Is there stdin worth sending? Not when it is closed or /dev/null (mpirun's usual)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    try:
        null = os.stat(os.devnull)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != (null.st_dev, null.st_ino)


def run_direct(context: dict, worker: dict, command: str) -> int:
    """One TLS connection of our own (no relay): costs ssl + a handshake per shim."""
    import signal
    import time

    from .exec_stream import connect, run_simple, session

    pod = worker["pod"]
    sid = f"{os.getpid()}-{os.urandom(4).hex()}"
    with_stdin = _fd_open(0)
    channel = connect(context, pod, wrapped(sid, command), stdin=with_stdin)
    grace = float(context.get("signal_grace", SIGNAL_GRACE))
    received = []
    forwarded_at = []

    def on_wakeup(timed_out):
        """Relay the first signal as a kill exec; hang up once the grace is over."""
        try:
            os.read(r, 512)
        except OSError:
            pass
        if forwarded_at:
            return False if time.monotonic() - forwarded_at[0] > grace else 0.2
        if not received:
            return None
        forwarded_at.append(time.monotonic())
        try:
            run_simple(context, pod, killer(signal.Signals(received[0]).name[3:], sid), timeout=grace)
        except (OSError, ValueError):
            pass
        return 0.2

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    previous = {
        s: signal.signal(s, lambda signum, _f: received.append(signum))
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        code = session(channel, 0 if with_stdin else None, r, on_wakeup)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(previous_fd)
        os.close(r)
        os.close(w)
        channel.close()
    if received and code == 255:
        return 128 + received[0]
    return code


def capture(context: dict, worker: dict, command: str, timeout: float):
    """Run ``command`` (``sh -c``) in the worker's pod without stdin, collecting its output:
    ``(status, stdout, stderr)`` bytes; TimeoutError past ``timeout`` seconds (the hang probe's
    channel, ``hang.collect``). Output goes to files, not pipes: one thread pumps the session."""
    import tempfile
    import time

    from .exec_stream import connect, session

    deadline = time.monotonic() + timeout
    channel = connect(context, worker["pod"], ["/bin/sh", "-c", command], stdin=False, timeout=timeout)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.write(wake_w, b".")  # the first wakeup sets the session's deadline
    expired = []

    def on_wakeup(_timed_out):
        try:
            os.read(wake_r, 64)
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            expired.append(True)
            return False
        return left

    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            status = session(
                channel, stdin_fd=None, wakeup_fd=wake_r, on_wakeup=on_wakeup, out_fd=out.fileno(), err_fd=err.fileno()
            )
            if expired:
                raise TimeoutError(f"no answer within {timeout:.0f} s")
            out.seek(0)
            err.seek(0)
            return status, out.read(), err.read()
    finally:
        os.close(wake_r)
        os.close(wake_w)
