"""Client connections: authentication handshake, the wire protocol, and
non-blocking send/receive plumbing. Mixed into :class:`.core.Agent`."""

import selectors
import socket
import signal
import time

from mpilaunch.rsh_agent import protocol as P

from .constants import MAX_PENDING_HANDSHAKES, STDIN_HIGH_WATER, OUT_LOW_WATER


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



class ConnectionsMixin:
    """Accepts and authenticates clients, decodes their frames, sends ours."""

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

