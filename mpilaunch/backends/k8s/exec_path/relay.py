"""The job's exec relay: one process holds the TLS setup, every shim borrows it.

    python -m mpilaunch.backends.k8s.exec_path.relay CONTEXT_JSON SOCKET [--exit-with-pid PID]

mpirun starts one ``mpilaunch-rsh`` per daemon and keeps it for the
daemon's life. With the relay each shim only connects to a unix socket,
passes its stdin/stdout/stderr descriptors (``SCM_RIGHTS``) and the command,
and waits for the exit code; it imports no ``ssl`` and makes no TLS
handshake. The relay opens the exec websocket with one shared SSLContext
and token and pumps the remote streams straight into the shim's own
descriptors, one thread per session (``poll``-based, so hundreds of
sessions are fine). Measured in benchmarks/bench_k8s.py.

Protocol on the unix socket: 4-byte big-endian length + ``EXEC\\0POD\\0COMMAND\\0STDIN``
(``STDIN`` ``1``: three descriptors 0/1/2 attached, ``0``: only 1/2), then
``SIG <n>\\n`` lines from the shim when it is signalled; the relay answers
``<exit code>\\n``. A shim that goes away hangs the session up (as ssh
would); a signal is relayed as a kill exec of the remote process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from ....core.pylauncher import PACKAGE_PARENT
from . import exec_stream, transport

READY_LINE = b"mpilaunch-relay-ready\n"


class Relay:
    def __init__(self, context: dict, path: str):
        self.context = context
        self.path = path
        self.tls = exec_stream.ssl_context(context)
        self.grace = float(context.get("signal_grace", transport.SIGNAL_GRACE))
        self.session = None
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        old = os.umask(0o177)
        try:
            self.server.bind(path)
        finally:
            os.umask(old)
        self.server.listen(1024)

    def token(self):
        # re-read per session: projected ServiceAccount tokens rotate in place
        return exec_stream.bearer_token(self.context)

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def _receive(self, conn: socket.socket):
        data, fds = b"", []
        msg, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += [
                    int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                    for i in range(0, len(payload) - len(payload) % 4, 4)
                ]
        data = msg
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("short request")
            data += chunk
        size = int.from_bytes(data[:4], "big")
        verb, pod, command, stdin = data[4 : 4 + size].split(b"\0", 3)
        rest = data[4 + size :]
        if verb != b"EXEC":
            raise ValueError(f"unknown request {verb!r}")
        return pod.decode(), command.decode("utf-8", "surrogateescape"), stdin == b"1", fds, rest

    def handle(self, conn: socket.socket) -> None:
        fds = []
        code = 255
        try:
            pod, command, with_stdin, fds, pending = self._receive(conn)
            if with_stdin:
                in_fd, out_fd, err_fd = fds[:3]
            else:
                in_fd, (out_fd, err_fd) = None, fds[:2]
            code = self.run(conn, pod, command, in_fd, out_fd, err_fd, pending)
        except Exception as e:  # one bad session must not take the relay down
            try:
                if len(fds) >= 2:
                    exec_stream.write_all(fds[-1], f"mpilaunch-rsh: {e}\n".encode())
            except OSError:
                pass
        finally:
            try:
                conn.sendall(b"%d\n" % code)
            except OSError:
                pass
            conn.close()
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def run(self, conn, pod, command, in_fd, out_fd, err_fd, pending: bytes) -> int:
        sid = f"r{os.getpid()}-{os.urandom(4).hex()}"
        token = self.token()
        try:
            channel = exec_stream.connect(
                self.context,
                pod,
                transport.wrapped(sid, command),
                stdin=in_fd is not None,
                tls=self.tls,
                token=token,
                tls_session=self.session,
            )
        except ValueError:  # a session the context no longer accepts
            self.session = None
            channel = exec_stream.connect(
                self.context, pod, transport.wrapped(sid, command), stdin=in_fd is not None, tls=self.tls, token=token
            )
        state = {"buf": pending, "forwarded": None, "hangup": False}

        def on_wakeup(timed_out):
            if state["forwarded"] is not None:
                if time.monotonic() - state["forwarded"] > self.grace:
                    return False
            if not timed_out and not state["hangup"]:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    # the shim is gone (killed): hang up like ssh, after the kill exec below
                    state["hangup"] = True
                    state["buf"] += b"SIG 1\n"
                state["buf"] += chunk
            while b"\n" in state["buf"]:
                line, state["buf"] = state["buf"].split(b"\n", 1)
                if line.startswith(b"SIG ") and state["forwarded"] is None:
                    state["forwarded"] = time.monotonic()
                    name = signal.Signals(int(line[4:])).name[3:]
                    try:
                        exec_stream.run_simple(
                            self.context,
                            pod,
                            transport.killer(name, sid),
                            timeout=self.grace,
                            tls=self.tls,
                            token=token,
                            err_fd=err_fd,
                        )
                    except (OSError, ValueError):
                        pass
            if state["hangup"]:
                return False  # the kill exec above already ran
            return 0.2 if state["forwarded"] is not None else None

        if state["buf"]:
            on_wakeup(True)
        try:
            return exec_stream.session(channel, in_fd, conn.fileno(), on_wakeup, out_fd=out_fd, err_fd=err_fd)
        finally:
            self._keep_session(channel)

    def _keep_session(self, channel) -> None:
        """Remember a resumable TLS session (TLS 1.3 tickets arrive after the handshake)."""
        session = channel.tls_session
        if session is not None and session.has_ticket:
            self.session = session


def start(context: dict, rundir, python: str | None = None):
    """Start a relay for this job (child process); return ``(Popen, socket path)``."""
    import subprocess
    from pathlib import Path

    rundir = Path(rundir)
    ctx_file = rundir / "relay-context.json"
    fd = os.open(ctx_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(context, f)
    path = str(rundir / "relay.sock")
    # the same mpilaunch as this one (a checkout, the job's tools zip in a launcher pod)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [
            python or sys.executable,
            "-m",
            "mpilaunch.backends.k8s.exec_path.relay",
            str(ctx_file),
            path,
            "--exit-with-pid",
            str(os.getpid()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    if line != READY_LINE:
        proc.kill()
        proc.wait()
        raise ConnectionError(f"the exec relay did not start (exit {proc.poll()})")
    proc.stdout.close()
    return proc, path


def stop(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except Exception:
        proc.kill()
        proc.wait()


def exit_with(pid: int) -> None:
    """End this process when ``pid`` (mpilaunch) is gone. A pidfd names that very process: polling
    its pid with kill(0) was fooled by a reused pid, and the relay (with its credentials) stayed."""
    import select

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd (old kernel): poll the pid
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
    select.select([pidfd], [], [])
    os._exit(0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ctx_file, path = argv[0], argv[1]
    parent = int(argv[argv.index("--exit-with-pid") + 1]) if "--exit-with-pid" in argv else None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with open(ctx_file) as f:
        context = json.load(f)
    relay = Relay(context, path)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if parent is not None:
        threading.Thread(target=exit_with, args=(parent,), daemon=True).start()
    os.write(1, READY_LINE)
    try:
        relay.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main())
