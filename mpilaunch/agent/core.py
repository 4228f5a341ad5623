"""The agent's event loop: one thread, one ``selectors`` loop, signals
delivered through a wakeup fd, timers for handshakes and lingering sessions.
Connections, pipes and supervision are mixins so each concern reads on its own."""

import os
import selectors
import signal
import socket
import sys
import time

from .connections import ConnectionsMixin
from .constants import (
    HANDSHAKE_TIMEOUT,
    KILL_GRACE,
    MAX_PENDING_HANDSHAKES,
    MAX_PENDING_PER_PEER,
    PDEATH_SIGNAL,
    PEER_ACCEPT_BURST,
    PEER_ACCEPTS_PER_SECOND,
    REFUSAL_NOTE_INTERVAL,
    SCAN_INTERVAL,
)
from .handshake_limits import AcceptRate, PendingLimits, QuietNotes
from .pipes import PipesMixin
from .proctree import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, pid_gone, prctl, processes_by_session
from .supervision import SupervisionMixin


class Agent(ConnectionsMixin, PipesMixin, SupervisionMixin):
    def __init__(
        self,
        name,
        secret,
        listener,
        extra_env=None,
        exit_with_pid=None,
        handshake_timeout=HANDSHAKE_TIMEOUT,
        kill_grace=KILL_GRACE,
        log=None,
        max_pending_per_peer=MAX_PENDING_PER_PEER,
        max_pending=MAX_PENDING_HANDSHAKES,
        accepts_per_second=PEER_ACCEPTS_PER_SECOND,
        accept_burst=PEER_ACCEPT_BURST,
        exit_on_stdin_eof=False,
        tls_context=None,
    ):
        self.name = name
        self.secret = secret  # the MAC secret (the credential's first part)
        # wire.tls.server_context of the job's certificate: every connection is TLS first;
        # None: none is (a credential without a certificate)
        self.tls_context = tls_context
        self.listener = listener
        # the local backend's: a Unix socket, whose clients must be this agent's own user (SO_PEERCRED)
        self.unix_listener = listener.family == socket.AF_UNIX
        self.uid = os.geteuid()
        self.base_env = dict(os.environ)
        self.base_env.update(extra_env or {})
        self.exit_with_pid = exit_with_pid
        # started over ssh (backends/ssh): the session's stdin closes when the ssh session ends, however
        # it ends; sshd sends no SIGHUP without a terminal, so end of file is the one sign
        self.exit_on_stdin_eof = exit_on_stdin_eof
        self.orphaned = False  # stopped because the --exit-with-pid process is gone (no cleanup of its own ran)
        self.handshake_timeout = handshake_timeout
        self.pending = PendingLimits(max_pending_per_peer, max_pending)  # unauthenticated connections
        self.accept_rate = AcceptRate(accepts_per_second, accept_burst)  # handshakes a peer may start
        self.quiet = QuietNotes(REFUSAL_NOTE_INTERVAL)
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

    def log(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        try:
            self.log_stream.write(f"{stamp} mpilaunch-agent[{self.name}]: {msg}\n")
            self.log_stream.flush()
        except (OSError, ValueError):
            pass

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
            prctl(PR_SET_PDEATHSIG, PDEATH_SIGNAL)
        try:
            self.pidfd = os.pidfd_open(pid)
            self.sel.register(self.pidfd, selectors.EVENT_READ, self._on_exit_pid)
        except (AttributeError, OSError):
            self.pidfd = None  # polled in _tick instead
        if pid_gone(pid):
            self.stop(f"process {pid} is gone")

    def _watch_stdin(self):
        if not self.exit_on_stdin_eof:
            return
        try:
            os.set_blocking(0, False)
            self.sel.register(0, selectors.EVENT_READ, self._on_stdin)
        except (OSError, ValueError) as exc:  # not pollable (a file, /dev/null): its end could never be seen
            self.stop(f"stdin cannot be watched for its end ({exc})")

    def _on_stdin(self, key, events):
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # what arrives before the end is ignored: only the end means something
            self.sel.unregister(0)
            self.stop("stdin closed: the session that started this agent ended")

    def serve(self) -> int:
        if not prctl(PR_SET_CHILD_SUBREAPER, 1):
            self.log("warning: cannot become a child subreaper; daemonized descendants may escape")
        self._install_signals()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._on_accept)
        self._watch_exit_pid()
        self._watch_stdin()
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
            elif signum == PDEATH_SIGNAL and self.exit_with_pid and pid_gone(self.exit_with_pid):
                self.orphaned = True
                self.stop(f"parent process {self.exit_with_pid} exited")

    def _on_exit_pid(self, key, events):
        self.orphaned = True
        self.stop(f"process {self.exit_with_pid} exited")

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
            if conn.state in ("tls", "hello"):
                self._quiet_note(conn.peer_key, "timeout", f"refused connection from {conn.peer}: handshake timed out")
            elif conn.state == "request":
                self.log(f"connection from {conn.peer} sent no request in time")
            self._close(conn)
        if self.exit_with_pid and self.pidfd is None and pid_gone(self.exit_with_pid):
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
