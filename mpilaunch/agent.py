"""``mpilaunch agent``: the exec agent that runs inside each worker.

It replaces sshd for ``mpilaunch-rsh``: it listens on TCP, authenticates each
connection with the job secret (``rsh_agent/protocol.py``), runs
``/bin/sh -c CMD`` in a fresh session and streams its stdio back.

Why it looks the way it does:

* One thread, one ``selectors`` loop.  Children are reaped centrally with
  ``waitpid(-1)`` because the agent is a child subreaper: daemonized
  descendants (``orted``/``prted`` call setsid and fork) are re-parented to
  the agent, and a per-child ``Popen.wait`` would race with that reaper.
* A session is "the leader's process group plus every descendant whose
  environment carries ``MPILAUNCH_SESSION=<id>``" (the environment survives
  setsid and double forks, the process group does not).  A session's EXIT is
  sent once the leader exited, its stdout/stderr reached EOF and no process
  of the session is left, so a daemonized orted keeps its shim (and mpirun's
  view of it) alive exactly as long as it lives.  A client that hangs up
  ends the session: everything in it is killed.
* The secret is read from a 0600 file or stdin, never from argv/environment,
  and is not passed to commands.
"""

import argparse
import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

from mpilaunch.rsh_agent import protocol as P

SESSION_ENV = "MPILAUNCH_SESSION"
WORKER_ENV = "MPILAUNCH_WORKER"
_SESSION_MARK = SESSION_ENV.encode() + b"="

HANDSHAKE_TIMEOUT = 10.0
KILL_GRACE = 1.0  # SIGTERM first, SIGKILL whatever is left this much later
# When the agent itself stops it is usually being killed too (YARN sends
# SIGKILL 250 ms after SIGTERM by default), so it escalates much sooner.
STOP_GRACE = 0.25
# Parent-death signal: a dedicated one, because the kernel also sends it when
# the *thread* that spawned us exits; on receipt we check the pid really died.
PDEATH_SIGNAL = signal.SIGUSR2
SCAN_INTERVAL = 0.5  # re-check lingering/killed sessions at least this often
OUT_HIGH_WATER = 1 << 20  # pause reading a session's pipes above this backlog
OUT_LOW_WATER = 1 << 18
STDIN_HIGH_WATER = 4 << 20  # pause reading the client above this stdin backlog
MAX_PENDING_HANDSHAKES = 1024
CMD_LOG_CHARS = 160

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


# --- process tree helpers (pure reads of /proc) -------------------------------


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


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    stat = _read(f"/proc/{pid}/stat")
    state = stat.rpartition(b")")[2].split()[:1]
    return state == [b"Z"] or not stat


# --- connection and session state ---------------------------------------------


class Conn:
    """One client connection: handshake, then at most one request."""

    __slots__ = ("sock", "fd", "peer", "state", "inbuf", "outbuf", "deadline", "nonce", "session", "reading",
                 "events")

    def __init__(self, sock, peer, deadline):
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.state = "hello"  # hello -> request -> running -> closing
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.deadline = deadline
        self.nonce = P.new_nonce()
        self.session = None
        self.reading = True
        self.events = selectors.EVENT_READ  # what the selector watches now (0: unregistered)


class Session:
    __slots__ = (
        "sid", "conn", "proc", "pid", "command", "started", "status", "pipes",
        "stdin_fd", "stdin_buf", "stdin_eof", "paused", "ending", "kill_at",
        "reason", "done",
    )

    def __init__(self, sid, conn, proc, command):
        self.sid = sid
        self.conn = conn
        self.proc = proc
        self.pid = proc.pid
        self.command = command
        self.started = time.monotonic()
        self.status = None  # leader exit code once reaped
        self.pipes = {proc.stdout.fileno(): P.STDOUT, proc.stderr.fileno(): P.STDERR}
        self.stdin_fd = proc.stdin.fileno()
        self.stdin_buf = bytearray()
        self.stdin_eof = False
        self.paused = False
        self.ending = False  # being torn down (client gone / agent stopping)
        self.kill_at = None  # when to escalate SIGTERM -> SIGKILL
        self.reason = None
        self.done = False


class Agent:
    def __init__(self, name, secret, listener, extra_env=None, exit_with_pid=None,
                 handshake_timeout=HANDSHAKE_TIMEOUT, kill_grace=KILL_GRACE, log=None):
        self.name = name
        self.secret = secret
        self.listener = listener
        self.base_env = dict(os.environ)
        self.base_env.update(extra_env or {})
        self.exit_with_pid = exit_with_pid
        self.handshake_timeout = handshake_timeout
        self.kill_grace = kill_grace
        self.log_stream = log or sys.stderr
        self.sel = selectors.DefaultSelector()
        self.conns = {}  # socket fd -> Conn
        self.sessions = {}  # sid -> Session
        self.leaders = {}  # leader pid -> Session
        self.pipe_owner = {}  # stdout/stderr pipe fd -> Session
        self.stdin_owner = {}  # stdin pipe fd -> Session, while waiting to write
        self.to_check = set()  # sessions whose leader and pipes are done
        self.counter = 0
        self.stopping = None
        self.scan_due = False
        self.next_scan = 0.0
        self.pidfd = None
        self.mypid = os.getpid()

    # -- logging -------------------------------------------------------------

    def log(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        try:
            self.log_stream.write(f"{stamp} mpilaunch-agent[{self.name}]: {msg}\n")
            self.log_stream.flush()
        except (OSError, ValueError):
            pass

    # -- setup ----------------------------------------------------------------

    def _install_signals(self):
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, PDEATH_SIGNAL):
            # A Python-level handler is needed for the C handler to write the
            # wakeup byte; the loop does the real work.
            signal.signal(sig, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_wakeup)

    def _watch_exit_pid(self):
        pid = self.exit_with_pid
        if pid is None:
            return
        if pid == os.getppid():
            _prctl(PR_SET_PDEATHSIG, PDEATH_SIGNAL)
        try:
            self.pidfd = os.pidfd_open(pid)
            self.sel.register(self.pidfd, selectors.EVENT_READ, self._on_exit_pid)
        except (AttributeError, OSError):
            self.pidfd = None  # polled in _tick instead
        if _pid_gone(pid):
            self.stop(f"process {pid} is gone")

    def serve(self) -> int:
        if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
            self.log("warning: cannot become a child subreaper; daemonized descendants may escape")
        self._install_signals()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._on_accept)
        self._watch_exit_pid()
        while self.stopping is None:
            timeout = self._next_timeout()
            for key, events in self.sel.select(timeout):
                try:
                    key.data(key, events)
                except Exception as exc:  # never let one bad connection stop the agent
                    self._internal_error(key, exc)
            try:
                self._tick()
            except Exception as exc:
                self._internal_error(None, exc)
        return self._shutdown()

    def _internal_error(self, key, exc):
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        self.log(f"internal error: {exc!r} at {os.path.basename(where.filename)}:{where.lineno}")
        conn = self.conns.get(key.fd) if key is not None else None
        if conn is not None:
            self._client_gone(conn, f"internal error: {exc!r}")

    def stop(self, reason: str) -> None:
        if self.stopping is None:
            self.stopping = reason

    # -- event handlers -----------------------------------------------------------

    def _on_wakeup(self, key, events):
        try:
            data = self.wake_r.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._reap()
            elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.stop(f"received {signal.Signals(signum).name}")
            elif signum == PDEATH_SIGNAL and self.exit_with_pid and _pid_gone(self.exit_with_pid):
                self.stop(f"parent process {self.exit_with_pid} exited")

    def _on_exit_pid(self, key, events):
        self.stop(f"process {self.exit_with_pid} exited")

    def _on_accept(self, key, events):
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: log, keep serving
                self.log(f"accept failed: {exc}")
                return
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
            pending = sum(1 for c in self.conns.values() if c.state in ("hello", "request"))
            if pending >= MAX_PENDING_HANDSHAKES:
                self.log(f"refused connection from {peer}: too many pending handshakes")
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, peer, time.monotonic() + self.handshake_timeout)
            self.conns[conn.fd] = conn
            self.sel.register(sock, selectors.EVENT_READ, self._on_conn)
            self._send(conn, P.server_hello(conn.nonce))

    def _on_conn(self, key, events):
        conn = self.conns.get(key.fd)
        if conn is None:
            return
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
            if conn.fd not in self.conns:
                return
        if events & selectors.EVENT_READ and conn.reading:
            try:
                data = conn.sock.recv(P.CHUNK * 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._client_gone(conn, "client disconnected")
                return
            conn.inbuf += data
            try:
                self._process_input(conn)
            except P.ProtocolError as exc:
                self._protocol_error(conn, str(exc))

    def _process_input(self, conn):
        if conn.state == "hello":
            if len(conn.inbuf) < P.CLIENT_HELLO_LEN:
                return
            hello = bytes(conn.inbuf[: P.CLIENT_HELLO_LEN])
            del conn.inbuf[: P.CLIENT_HELLO_LEN]
            client_nonce = P.check_client_hello(self.secret, conn.nonce, hello)
            self._send(conn, P.server_proof(self.secret, conn.nonce, client_nonce))
            conn.state = "request"
        if conn.state == "closing":
            conn.inbuf.clear()
            return
        if conn.state in ("request", "running"):
            for ftype, payload in P.pop_frames(conn.inbuf, P.CLIENT_TYPES):
                if conn.state == "request":
                    self._handle_request(conn, ftype, payload)
                elif conn.state == "running":
                    self._handle_session_frame(conn, ftype, payload)
                # frames after a PING/failed request are ignored (closing)

    def _handle_request(self, conn, ftype, payload):
        if ftype == P.PING:
            self._send(conn, P.frame(P.PONG))
            self._close_after_flush(conn)
            return
        if ftype != P.RUN:
            raise P.ProtocolError("expected a run or ping request")
        command, env, cwd = P.decode_run(payload)
        self._start_session(conn, command, env, cwd)

    def _handle_session_frame(self, conn, ftype, payload):
        sess = conn.session
        if ftype == P.STDIN:
            if sess.stdin_fd is None or sess.stdin_eof:
                return
            if payload:
                sess.stdin_buf += payload
            else:
                sess.stdin_eof = True
            self._pump_stdin(sess)
            if len(sess.stdin_buf) > STDIN_HIGH_WATER:
                self._set_conn_reading(conn, False)
        elif ftype == P.SIGNAL:
            signum = P.decode_int(payload)
            if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL,
                          signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
                self._signal_session(sess, signum)
        else:
            raise P.ProtocolError("unexpected frame during a session")

    # -- sessions ------------------------------------------------------------------

    def _start_session(self, conn, command, env, cwd):
        self.counter += 1
        sid = f"{self.name}.{self.counter}.{os.urandom(4).hex()}"
        child_env = dict(self.base_env)
        child_env.update(env)
        # Markers last so a client cannot hide a session from the cleanup scan.
        child_env[WORKER_ENV] = self.name
        child_env[SESSION_ENV] = sid
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=child_env, cwd=cwd, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            where = f" in {cwd}" if cwd else ""
            msg = f"cannot start command{where}: {exc.strerror or exc}"
            self.log(f"session {sid} refused for {conn.peer}: {msg}")
            self._send(conn, P.frame(P.ERROR, msg.encode()))
            self._close_after_flush(conn)
            return
        sess = Session(sid, conn, proc, command)
        conn.session = sess
        conn.state = "running"
        conn.deadline = None
        self.sessions[sid] = sess
        self.leaders[sess.pid] = sess
        for fd in sess.pipes:
            os.set_blocking(fd, False)
            self.pipe_owner[fd] = sess
            self.sel.register(fd, selectors.EVENT_READ, self._on_pipe)
        os.set_blocking(sess.stdin_fd, False)
        shown = command if len(command) <= CMD_LOG_CHARS else command[:CMD_LOG_CHARS] + "..."
        self.log(f"session {sid} start pid={sess.pid} peer={conn.peer}"
                 f"{' cwd=' + cwd if cwd else ''} cmd={shown!r}")
        self._send(conn, P.frame(P.STARTED, P.encode_started(sid, sess.pid)))

    def _on_pipe(self, key, events):
        sess = self.pipe_owner.get(key.fd)
        if sess is None:
            return
        try:
            data = os.read(key.fd, P.CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(sess, key.fd)
            self._check_finished(sess)
            return
        conn = sess.conn
        if conn is not None:
            self._send(conn, P.frame(sess.pipes[key.fd], data))
            if len(conn.outbuf) > OUT_HIGH_WATER:
                self._pause_pipes(sess, True)

    def _close_pipe(self, sess, fd):
        if fd in self.pipe_owner:
            self.sel.unregister(fd)
            del self.pipe_owner[fd]
        sess.pipes.pop(fd, None)
        # Close through the file object: a bare os.close() would leave Popen's
        # file object to close the same number again later, by then possibly
        # a new client's socket.
        for stream in (sess.proc.stdout, sess.proc.stderr):
            if stream is not None and not stream.closed and stream.fileno() == fd:
                stream.close()

    def _pause_pipes(self, sess, pause):
        if sess.paused == pause:
            return
        sess.paused = pause
        for fd in sess.pipes:
            if pause:
                self.sel.unregister(fd)
            else:
                self.sel.register(fd, selectors.EVENT_READ, self._on_pipe)

    def _pump_stdin(self, sess):
        fd = sess.stdin_fd
        if fd is None:
            return
        while sess.stdin_buf:
            try:
                n = os.write(fd, sess.stdin_buf)
            except BlockingIOError:
                break
            except OSError:  # reader gone: drop what it will never read
                sess.stdin_buf.clear()
                sess.stdin_eof = True
                break
            del sess.stdin_buf[:n]
        registered = self._stdin_registered(sess)
        if sess.stdin_buf and not registered:
            self.sel.register(fd, selectors.EVENT_WRITE, self._on_stdin_writable)
            self.stdin_owner[fd] = sess
        elif not sess.stdin_buf and registered:
            self.sel.unregister(fd)
            del self.stdin_owner[fd]
        if not sess.stdin_buf:
            if sess.conn is not None and not sess.conn.reading and not sess.ending:
                self._set_conn_reading(sess.conn, True)
            if sess.stdin_eof:
                self._close_stdin(sess)

    def _stdin_registered(self, sess):
        return sess.stdin_fd in self.stdin_owner

    def _on_stdin_writable(self, key, events):
        sess = self.stdin_owner.get(key.fd)
        if sess is not None:
            self._pump_stdin(sess)

    def _close_stdin(self, sess):
        if sess.stdin_fd is None:
            return
        if self._stdin_registered(sess):
            self.sel.unregister(sess.stdin_fd)
            del self.stdin_owner[sess.stdin_fd]
        try:
            sess.proc.stdin.close()
        except OSError:
            pass
        sess.stdin_fd = None
        sess.stdin_buf.clear()

    def _reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sess = self.leaders.pop(pid, None)
            if sess is None:
                self.scan_due = True  # an adopted orphan died: sessions may be done
                continue
            sess.status = P.exit_code_from_wait_status(status)
            sess.proc.returncode = sess.status  # keep Popen from waiting on it again
            self._close_stdin(sess)
            self._check_finished(sess)

    def _check_finished(self, sess):
        """Leader gone and pipes at EOF: queue a check for leftover descendants.

        The check runs in ``_tick`` after this loop iteration, so sessions that
        end together share one /proc walk.
        """
        if not sess.done and sess.status is not None and not sess.pipes:
            self.to_check.add(sess)

    def _finish(self, sess):
        sess.done = True
        self.sessions.pop(sess.sid, None)
        for fd in list(sess.pipes):
            self._close_pipe(sess, fd)
        self._close_stdin(sess)
        conn = sess.conn
        duration = time.monotonic() - sess.started
        status = sess.status if sess.status is not None else 255
        if conn is not None and not sess.ending:
            self._send(conn, P.frame(P.EXIT, P.encode_int(status)))
            self._close_after_flush(conn)
        reason = sess.reason or "exited"
        self.log(f"session {sess.sid} end status={status} reason={reason} duration={duration:.2f}s")

    def _signal_session(self, sess, sig, pids=None):
        # Once the leader is reaped its pid may be recycled as someone else's
        # group; from then on the session marker alone finds the members.
        if sess.status is None:
            _killpg(sess.pid, sig)
        if pids is None:
            pids = processes_by_session(self.mypid).get(sess.sid, [])
        for pid in pids:
            _kill(pid, sig)

    def _end_session(self, sess, reason):
        """Kill everything in the session; it is finished once nothing is left."""
        if sess.ending or sess.done:
            return
        sess.ending = True
        sess.reason = reason
        conn, sess.conn = sess.conn, None
        if conn is not None:
            self._close(conn)
        for fd in list(sess.pipes):
            self._close_pipe(sess, fd)
        self._close_stdin(sess)
        self._signal_session(sess, signal.SIGTERM)
        sess.kill_at = time.monotonic() + self.kill_grace
        self.scan_due = True

    def _client_gone(self, conn, reason):
        sess = conn.session
        if sess is not None and not sess.done:
            self._end_session(sess, reason)
            return
        if conn.state == "hello":
            self.log(f"refused connection from {conn.peer}: closed before authenticating")
        elif conn.state == "request":
            self.log(f"connection from {conn.peer} closed without a request")
        self._close(conn)

    def _protocol_error(self, conn, reason):
        sess = conn.session
        if sess is not None:
            self.log(f"session {sess.sid}: protocol error from {conn.peer}: {reason}")
            self._end_session(sess, f"protocol error: {reason}")
        else:
            self.log(f"refused connection from {conn.peer}: {reason}")
            self._close(conn)

    # -- connection plumbing -----------------------------------------------------------

    def _send(self, conn, data):
        conn.outbuf += data
        self._flush(conn)

    def _flush(self, conn):
        if conn.fd not in self.conns:
            return
        if conn.outbuf:
            try:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._client_gone(conn, "client connection broken")
                return
        if not conn.outbuf and conn.state == "closing":
            self._close(conn)
            return
        sess = conn.session
        if sess is not None and sess.paused and len(conn.outbuf) < OUT_LOW_WATER:
            self._pause_pipes(sess, False)
        self._update_interest(conn)

    def _update_interest(self, conn):
        events = selectors.EVENT_READ if conn.reading else 0
        if conn.outbuf:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self.sel.register(conn.sock, events, self._on_conn)
        elif events == 0:
            self.sel.unregister(conn.sock)
        else:
            self.sel.modify(conn.sock, events, self._on_conn)
        conn.events = events

    def _set_conn_reading(self, conn, reading):
        conn.reading = reading
        if conn.fd in self.conns:
            self._update_interest(conn)

    def _close_after_flush(self, conn):
        conn.state = "closing"
        conn.deadline = time.monotonic() + self.handshake_timeout
        self._flush(conn)

    def _close(self, conn):
        if self.conns.pop(conn.fd, None) is None:
            return
        if conn.events:
            self.sel.unregister(conn.sock)
            conn.events = 0
        conn.sock.close()

    # -- timers --------------------------------------------------------------------

    def _next_timeout(self):
        now = time.monotonic()
        wake = now + SCAN_INTERVAL if (self.pidfd is None and self.exit_with_pid) else now + 5.0
        for conn in self.conns.values():
            if conn.deadline is not None:
                wake = min(wake, conn.deadline)
        if self.to_check:
            return 0.0
        if self.scan_due or any(s.status is not None or s.ending for s in self.sessions.values()):
            wake = min(wake, max(self.next_scan, now + 0.05))
        return max(0.0, wake - now)

    def _tick(self):
        now = time.monotonic()
        self._reap()  # cheap; covers a SIGCHLD wakeup byte lost to a full buffer
        if self.to_check:
            checks, self.to_check = self.to_check, set()
            alive = processes_by_session(self.mypid)
            for sess in checks:
                if sess.done:
                    continue
                if sess.sid in alive:
                    self.scan_due = True  # daemonized descendants still run: linger
                else:
                    self._finish(sess)
        for conn in [c for c in self.conns.values() if c.deadline is not None and c.deadline <= now]:
            if conn.state == "closing":
                self._close(conn)
            else:
                self.log(f"refused connection from {conn.peer}: handshake timed out")
                self._close(conn)
        if self.exit_with_pid and self.pidfd is None and _pid_gone(self.exit_with_pid):
            self.stop(f"process {self.exit_with_pid} is gone")
        waiting = [s for s in self.sessions.values() if (s.status is not None and not s.pipes) or s.ending]
        if waiting and (self.scan_due or now >= self.next_scan):
            self.scan_due = False
            self.next_scan = now + SCAN_INTERVAL
            alive = processes_by_session(self.mypid)
            for sess in waiting:
                pids = alive.get(sess.sid, [])
                if sess.ending and sess.kill_at is not None and now >= sess.kill_at:
                    self._signal_session(sess, signal.SIGKILL, pids)
                if not pids and sess.status is not None:
                    self._finish(sess)
        elif not waiting:
            self.scan_due = False

    # -- shutdown ------------------------------------------------------------------

    def _shutdown(self) -> int:
        self.log(f"stopping: {self.stopping}; killing {len(self.sessions)} session(s)")
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        for conn in list(self.conns.values()):
            self._close(conn)
        for sess in list(self.sessions.values()):
            sess.conn = None
            sess.ending = True
            sess.reason = sess.reason or f"agent stopping ({self.stopping})"
            if sess.status is None:
                _killpg(sess.pid, signal.SIGTERM)
        for pid in descendants(self.mypid):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.kill_grace, STOP_GRACE)
        while time.monotonic() < deadline and descendants(self.mypid):
            self._reap()
            time.sleep(0.02)
        for _ in range(50):  # repeat: a dying daemon may still fork
            left = descendants(self.mypid)
            if not left:
                break
            for sess in self.sessions.values():
                if sess.status is None:
                    _killpg(sess.pid, signal.SIGKILL)
            for pid in left:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.02)
            self._reap()
        self._reap()
        for sess in list(self.sessions.values()):
            if not sess.done:
                self._finish(sess)
        self.log("stopped")
        return 0


# --- command line ---------------------------------------------------------------


def _parse_env_pair(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mpilaunch agent",
        description="Exec agent for mpilaunch-rsh: runs authenticated commands inside this worker.",
    )
    parser.add_argument("--name", required=True, help="worker name (exported as MPILAUNCH_WORKER)")
    parser.add_argument("--listen", default="0.0.0.0:0", help="HOST:PORT to listen on; port 0 picks one")
    parser.add_argument("--address-file", help="write the reachable HOST:PORT here once listening")
    parser.add_argument("--advertise", help="host name/address to write to the address file")
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument("--secret-file", help="job secret file (must not be group/world readable)")
    secret.add_argument("--secret-stdin", action="store_true", help="read the job secret as one line from stdin")
    parser.add_argument("--exit-with-pid", type=int, help="stop (killing all sessions) when this process is gone")
    parser.add_argument("--env", action="append", type=_parse_env_pair, default=[], metavar="K=V",
                        help="extra environment for every command (repeatable)")
    parser.add_argument("--handshake-timeout", type=float, default=HANDSHAKE_TIMEOUT, help=argparse.SUPPRESS)
    parser.add_argument("--kill-grace", type=float, default=KILL_GRACE, help=argparse.SUPPRESS)
    return parser


def _load_secret(args) -> bytes:
    if args.secret_stdin:
        line = sys.stdin.buffer.readline()
        secret = line.strip()
        if not secret:
            raise ValueError("no secret on stdin")
        return secret
    from mpilaunch.rsh_agent.agent_client import read_secret

    return read_secret(args.secret_file)


def _listen(spec: str) -> socket.socket:
    host, port = P.parse_address(spec if ":" in spec else f"{spec}:0")
    infos = socket.getaddrinfo(host or None, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, stype, proto, _, addr = infos[0]
    sock = socket.socket(family, stype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(1024)
    return sock


def _advertised_address(sock, listen_host: str, advertise: str | None) -> str:
    port = sock.getsockname()[1]
    host = advertise or listen_host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _raise_fd_limit():
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    except (ImportError, ValueError, OSError):
        pass


# MPI names shared-memory segments and session directories after the host
# name and local rank, under TMPDIR and /dev/shm. Two workers on one machine
# (local backend, two YARN containers on one NodeManager) would map each
# other's segments and crash (seen: Open MPI 4 vader segfaults), so every
# worker gets a private directory for both, as a separate machine would have.
PRIVATE_DIR_VARS = (
    "TMPDIR",
    "OMPI_MCA_btl_vader_backing_directory",
    "OMPI_MCA_btl_sm_backing_directory",
    "OMPI_MCA_shmem_mmap_backing_file_base_dir",
)


# Open MPI 5's hierarchical collectives (coll/han) build node-level
# communicators from host locality; when several workers share one machine
# (and host name) that topology is wrong and large allreduces segfault in the
# TCP BTL (seen with two local workers; the plain /bin/sh-agent floor crashes
# the same way). Other collective components are unaffected.
SHARED_HOST_DEFAULTS = {"OMPI_MCA_coll": "^han"}


def private_dir_env(directory: str, given: dict) -> dict:
    """Defaults for PRIVATE_DIR_VARS and SHARED_HOST_DEFAULTS; values passed with --env win."""
    env = {name: given.get(name, directory) for name in PRIVATE_DIR_VARS}
    env.update({name: given.get(name, value) for name, value in SHARED_HOST_DEFAULTS.items()})
    return env


def main(argv=None) -> int:
    """Run the agent until SIGTERM/SIGINT or --exit-with-pid; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        secret = _load_secret(args)
    except (OSError, ValueError) as exc:
        print(f"mpilaunch: error: agent cannot read the job secret: {exc}", file=sys.stderr)
        return 2
    _raise_fd_limit()
    try:
        listener = _listen(args.listen)
    except (OSError, ValueError) as exc:
        print(f"mpilaunch: error: agent cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    import shutil
    import tempfile

    private = tempfile.mkdtemp(prefix=f"mpilaunch-{os.path.basename(args.name)}-")
    extra_env = dict(args.env)
    extra_env.update(private_dir_env(private, extra_env))
    agent = Agent(args.name, secret, listener, extra_env=extra_env, exit_with_pid=args.exit_with_pid,
                  handshake_timeout=args.handshake_timeout, kill_grace=args.kill_grace)
    address = _advertised_address(listener, P.parse_address(args.listen)[0] if ":" in args.listen else args.listen,
                                  args.advertise)
    if args.address_file:
        _write_atomically(args.address_file, address)
    agent.log(f"listening on {address} (pid {os.getpid()})")
    try:
        return agent.serve()
    finally:
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
