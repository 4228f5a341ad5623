"""Client connections: admission, authentication handshake, the wire
protocol, and non-blocking send/receive plumbing. Mixed into
:class:`.core.Agent`."""

import selectors
import signal
import socket
import time

from mpilaunch.wire import protocol as P
from mpilaunch.wire import tls

from .constants import CLOSE_LINGER, OUT_LOW_WATER, STDIN_HIGH_WATER
from .handshake_limits import peer_credentials, peer_key


class Conn:
    """One client connection: handshake, then at most one request."""

    __slots__ = (
        "sock",
        "fd",
        "peer",
        "peer_key",
        "state",
        "inbuf",
        "outbuf",
        "deadline",
        "nonce",
        "session",
        "reading",
        "events",
        "channel",
        "pending",
        "link",
    )

    def __init__(self, sock, peer, key, deadline, link):
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.peer_key = key  # what the per-peer limit counts (agent/handshake_limits.py)
        self.pending = True  # counted in the agent's PendingLimits until it authenticates or closes
        self.channel = None  # protocol.Channel once authenticated
        # tls -> hello -> request -> running -> closing ("tls" only with the job's certificate)
        self.state = "hello" if link is tls.PLAIN else "tls"
        self.link = link  # tls.Tls or tls.PLAIN: outbuf holds what it encrypted, inbuf what it decrypted
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
            sock.setblocking(False)
            if self.unix_listener:
                who = self._local_peer(sock)
                if who is None:
                    continue
                peer, key = who
            else:
                host = addr[0] if isinstance(addr, tuple) else str(addr)
                peer = f"{host}:{addr[1]}" if isinstance(addr, tuple) else host
                key = peer_key(host)
            refusal = self._admission(key)
            if refusal is not None:
                self._quiet_note(key, refusal, f"refused connection from {peer}: {refusal}")
                try:  # a real client backs off and retries; nothing else is read or sent
                    sock.send(P.SERVER_BUSY)
                except OSError:
                    pass
                sock.close()
                continue
            if not self.unix_listener:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = tls.PLAIN if self.tls_context is None else self._tls_link()
            conn = Conn(sock, peer, key, time.monotonic() + self.handshake_timeout, link)
            self.conns[conn.fd] = conn
            self.sel.register(sock, selectors.EVENT_READ, self._on_conn)
            if conn.state == "hello":  # with TLS, once the client finished its handshake
                self._send(conn, P.server_hello(conn.nonce))

    def _admission(self, key):
        """None when ``key`` may start a handshake now (and it is counted), else why not.

        The rate applies to network peers only: a Unix socket's peer is this
        agent's own user (``_local_peer``), who can read the job's secret anyway."""
        if not self.unix_listener and not self.accept_rate.take(key, time.monotonic()):
            return (
                f"too many connections from this peer (more than {self.accept_rate.burst} at once, "
                f"then {self.accept_rate.per_second:g} a second)"
            )
        return self.pending.admit(key)

    def _local_peer(self, sock):
        """``(peer, key)`` of a Unix socket's client of this agent's own user; None (and closed) for
        anyone else. The local backend's socket sits in the job's 0700 run directory, so another
        user should not get this far; this is the check that does not depend on that mode."""
        try:
            pid, uid = peer_credentials(sock)
        except OSError as exc:
            self.log(f"refused a local connection: its credentials cannot be read ({exc})")
            sock.close()
            return None
        if uid != self.uid:
            key = f"uid {uid}"
            self._quiet_note(
                key, "uid", f"refused connection from pid {pid} (uid {uid}): only uid {self.uid} may connect"
            )
            sock.close()
            return None
        return f"pid {pid}", f"uid {uid}"

    def _tls_link(self):
        from mpilaunch.wire.tls_session import Tls

        return Tls(self.tls_context, True)

    def _quiet_note(self, key, reason, text):
        line = self.quiet.note(key, reason, text, time.monotonic())
        if line is not None:
            self.log(line)

    def _authenticated(self, conn, channel):
        conn.channel = channel
        conn.state = "request"
        # The request gets its own window: counted from the accept, a handshake that took a
        # loaded host most of HANDSHAKE_TIMEOUT left the client no time to send it, and the
        # agent closed an authenticated session before it began (the shim: "lost connection").
        conn.deadline = time.monotonic() + self.handshake_timeout
        self._release_pending(conn)

    def _release_pending(self, conn):
        if conn.pending:
            conn.pending = False
            self.pending.release(conn.peer_key)

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
            try:
                self._receive(conn, data)
                self._process_input(conn)
            except P.ProtocolError as exc:
                self._protocol_error(conn, str(exc))

    def _receive(self, conn, data):
        """Wire bytes in: the TLS handshake's, or plaintext for ``inbuf``."""
        try:
            if conn.state == "tls":
                done = conn.link.handshake(data)
                self._send_wire(conn, conn.link.take())
                if not done:
                    return
                conn.state = "hello"
                self._send(conn, P.server_hello(conn.nonce))
                data = b""  # a client sends nothing more before our hello
            conn.inbuf += conn.link.decrypt(data)
            self._send_wire(conn, conn.link.take())
        except tls.TlsError as exc:
            # Not a client of this job (no TLS at all), or a tampered record.
            raise P.ProtocolError(f"TLS failed: {exc}") from None

    def _process_input(self, conn):
        if conn.state == "hello":
            if len(conn.inbuf) < P.CLIENT_HELLO_LEN:
                return
            hello = bytes(conn.inbuf[: P.CLIENT_HELLO_LEN])
            del conn.inbuf[: P.CLIENT_HELLO_LEN]
            client_nonce = P.check_client_hello(self.secret, conn.nonce, hello)
            self._send(conn, P.server_proof(self.secret, conn.nonce, client_nonce))
            self._authenticated(conn, P.Channel(P.session_key(self.secret, conn.nonce, client_nonce), P.AGENT))
        if conn.state == "closing":
            conn.inbuf.clear()
            return
        if conn.state in ("request", "running"):
            # A frame that fails its tag raises before any frame of the batch is acted on.
            for ftype, payload in conn.channel.pop_frames(conn.inbuf, P.CLIENT_TYPES):
                if conn.state == "request":
                    self._handle_request(conn, ftype, payload)
                elif conn.state == "running":
                    self._handle_session_frame(conn, ftype, payload)

    def _handle_request(self, conn, ftype, payload):
        if ftype == P.PING:
            self._send_frame(conn, P.PONG)
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
            if signum in (
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGHUP,
                signal.SIGKILL,
                signal.SIGQUIT,
                signal.SIGUSR1,
                signal.SIGUSR2,
            ):
                self._signal_session(sess, signum)
        else:
            raise P.ProtocolError("unexpected frame during a session")

    def _client_gone(self, conn, reason):
        sess = conn.session
        if sess is not None and not sess.done:
            self._end_session(sess, reason)
            return
        if conn.state in ("tls", "hello"):
            self._quiet_note(
                conn.peer_key, "closed", f"refused connection from {conn.peer}: closed before authenticating"
            )
        elif conn.state == "request":
            self.log(f"connection from {conn.peer} closed without a request")
        self._close(conn)

    def _protocol_error(self, conn, reason):
        sess = conn.session
        if sess is not None:
            self.log(f"session {sess.sid}: protocol error from {conn.peer}: {reason}")
            self._end_session(sess, f"protocol error: {reason}")
        elif conn.state in ("tls", "hello"):  # anyone can cause these: keep them from flooding the log
            self._quiet_note(conn.peer_key, reason, f"refused connection from {conn.peer}: {reason}")
            self._close(conn)
        else:
            self.log(f"refused connection from {conn.peer}: {reason}")
            self._close(conn)

    def _send_frame(self, conn, ftype, payload=b""):
        self._send(conn, conn.channel.frame(ftype, payload))

    def _send(self, conn, data):
        """Plaintext out, encrypted where the connection has TLS."""
        self._send_wire(conn, conn.link.encrypt(data))

    def _send_wire(self, conn, data):
        if data:
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
        conn.deadline = time.monotonic() + CLOSE_LINGER
        self._flush(conn)

    def _close(self, conn):
        if self.conns.pop(conn.fd, None) is None:
            return
        self._release_pending(conn)
        if conn.events:
            self.sel.unregister(conn.sock)
            conn.events = 0
        conn.sock.close()
