"""Process supervision: start a session's command, reap it, find its
daemonized descendants, and end all of them. Mixed into :class:`.core.Agent`."""

import os
import selectors
import signal
import subprocess
import time

from mpilaunch.wire import protocol as P

from .constants import CMD_LOG_CHARS, SESSION_ENV, STOP_GRACE, WORKER_ENV
from .proctree import descendants, kill_quietly, killpg_quietly, processes_by_session


class Session:
    __slots__ = (
        "sid",
        "conn",
        "proc",
        "pid",
        "command",
        "started",
        "status",
        "pipes",
        "stdin_fd",
        "stdin_buf",
        "stdin_eof",
        "paused",
        "ending",
        "kill_at",
        "reason",
        "done",
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


class SupervisionMixin:
    """Sessions from start to the last descendant's exit."""

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
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            where = f" in {cwd}" if cwd else ""
            msg = f"cannot start command{where}: {exc.strerror or exc}"
            self.log(f"session {sid} refused for {conn.peer}: {msg}")
            self._send_frame(conn, P.ERROR, msg.encode())
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
        self.log(f"session {sid} start pid={sess.pid} peer={conn.peer}{' cwd=' + cwd if cwd else ''} cmd={shown!r}")
        self._send_frame(conn, P.STARTED, P.encode_started(sid, sess.pid))

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
            self._send_frame(conn, P.EXIT, P.encode_int(status))
            self._close_after_flush(conn)
        reason = sess.reason or "exited"
        self.log(f"session {sess.sid} end status={status} reason={reason} duration={duration:.2f}s")

    def _signal_session(self, sess, sig, pids=None):
        # Once the leader is reaped its pid may be recycled as someone else's
        # group; from then on the session marker alone finds the members.
        if sess.status is None:
            killpg_quietly(sess.pid, sig)
        if pids is None:
            pids = processes_by_session(self.mypid).get(sess.sid, [])
        for pid in pids:
            kill_quietly(pid, sig)

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
                killpg_quietly(sess.pid, signal.SIGTERM)
        for pid in descendants(self.mypid):
            kill_quietly(pid, signal.SIGTERM)
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
                    killpg_quietly(sess.pid, signal.SIGKILL)
            for pid in left:
                kill_quietly(pid, signal.SIGKILL)
            time.sleep(0.02)
            self._reap()
        self._reap()
        for sess in list(self.sessions.values()):
            if not sess.done:
                self._finish(sess)
        self.log("stopped")
        return 0
