"""A session's pipes to and from its client: stdout/stderr out as frames, STDIN frames in, with
back-pressure both ways. Mixed into :class:`.core.Agent`. (Not the Kubernetes exec relay,
backends/k8s/exec_path/relay.py: "relay" names that one alone.)"""

import os
import selectors

from mpilaunch.wire import protocol as P

from .constants import OUT_HIGH_WATER


class PipesMixin:
    """stdout/stderr -> client frames; client STDIN frames -> the session's stdin."""

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
            self._send_frame(conn, sess.pipes[key.fd], data)
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
