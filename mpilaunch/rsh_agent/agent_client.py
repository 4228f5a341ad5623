"""Client side of the exec-agent protocol (see ``protocol.py``).

Used by the shim (hot path: only ``_socket``, ``select``, ``_signal``, ``_ssl``
(``tls.py``) and ``os``, no ``socket.py``/``signal.py``/``ssl.py`` which pull in
``enum``/``selectors``)
and by the orchestrator (``ping`` to wait for agents, ``run_command`` to run
something in a worker).
"""

from __future__ import annotations

import _socket
import os
import select

from mpilaunch.wire import protocol as P
from mpilaunch.wire import tls

DEFAULT_CONNECT_TIMEOUT = 10.0
_OUT_HIGH_WATER = 1 << 20  # stop reading stdin while this much is unsent


class AgentError(ConnectionError):
    """The agent could not be reached, refused us, or the connection died."""


def read_secret(path: str, shared_ok: bool = False) -> bytes:
    """Read a job secret file; refuse one that group or others may read.

    ``shared_ok``: a Kubernetes Secret volume, private to one pod whose
    processes all belong to the job; its files are world-readable so that any
    image user can read them (the kubelet makes them root-owned).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o044 and not shared_ok:
            raise PermissionError(
                f"secret file {path} is readable by group or others (mode {mode & 0o777:o}); chmod 600 it"
            )
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    secret = data.strip()
    if not secret:
        raise ValueError(f"secret file {path} is empty")
    return secret


def _connect(address: str, timeout: float, refused_wait: float = 0.0):
    """A connected socket; a refused connection is tried again for ``refused_wait`` seconds
    (a pod is Ready once its container started, a moment before its agent listens)."""
    if refused_wait > 0:
        deadline = _monotonic() + refused_wait
        while True:
            try:
                return _connect(address, timeout)
            except AgentError as exc:
                if not isinstance(exc.__cause__, ConnectionRefusedError) or _monotonic() > deadline:
                    raise
            select.select([], [], [], 0.05)
    unix = P.unix_sockaddr(address)
    if unix is not None:
        return _connect_unix(address, unix, timeout)
    host, port = P.parse_address(address)
    last = None
    try:
        # ASCII bytes: with a str host getaddrinfo imports encodings.idna
        # (re, enum, unicodedata), ~7 ms on every shim start.
        query = host.encode("ascii") if host.isascii() else host
        infos = _socket.getaddrinfo(query, port, 0, _socket.SOCK_STREAM)
    except OSError as exc:
        raise AgentError(f"cannot resolve agent address {address}: {exc}") from None
    for family, stype, proto, _, sockaddr in infos:
        sock = _socket.socket(family, stype, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            last = exc
            sock.close()
    raise AgentError(f"cannot connect to agent at {address}: {last}") from last


def _connect_unix(address: str, sockaddr: str, timeout: float):
    """A local backend's agent: a Unix socket in the job's private run directory."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(sockaddr)
        return sock
    except OSError as exc:
        sock.close()
        raise AgentError(f"cannot connect to agent at {address}: {exc}") from exc


def _recv_some(sock, address: str) -> bytes:
    """What the blocking socket has (at least one byte); AgentError when it closed, failed or timed out."""
    try:
        chunk = sock.recv(P.CHUNK)
    except TimeoutError:
        raise AgentError(f"agent at {address} did not answer the handshake in time") from None
    except OSError as exc:
        raise AgentError(f"connection to agent at {address} failed: {exc}") from None
    if not chunk:
        raise AgentError(
            f"agent at {address} closed the connection during the handshake "
            "(wrong job secret, or not an mpilaunch agent)"
        )
    return chunk


class _Wire:
    """The blocking socket of a handshake, through the connection's TLS (``tls.PLAIN`` without).

    ``buf`` keeps plaintext that arrived past what was asked for; it is the
    start of the session's input.
    """

    __slots__ = ("sock", "link", "address", "buf")

    def __init__(self, sock, link, address: str):
        self.sock = sock
        self.link = link
        self.address = address
        self.buf = bytearray()

    def recv_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.feed(_recv_some(self.sock, self.address))
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def feed(self, wire: bytes) -> None:
        try:
            self.buf += self.link.decrypt(wire)
        except tls.TlsError as exc:
            raise _Refused(f"agent at {self.address}: TLS failed: {exc}") from None
        answer = self.link.take()
        if answer:
            self.sock.sendall(answer)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(self.link.encrypt(data))


class _Refused(AgentError):
    """The agent is not the job's (TLS refused it, or it did not use TLS): never tried again."""


def _tls_handshake(wire: _Wire) -> None:
    """TLS with the agent, pinned to the job's certificate.

    An agent that refuses us before TLS (``SERVER_BUSY``, sent in clear on
    accept) is told apart by its first byte: no TLS record starts with the
    protocol's MAGIC.
    """
    link, sock, address = wire.link, wire.sock, wire.address
    link.handshake()
    sock.sendall(link.take())
    first = True
    while True:
        data = _recv_some(sock, address)
        if first and not tls.looks_like_tls(data[0]):
            while len(data) < P.SERVER_HELLO_LEN and data[:1] == P.MAGIC[:1]:
                data += _recv_some(sock, address)
            if data[: P.SERVER_HELLO_LEN] == P.SERVER_BUSY:
                raise _Busy()
            raise _Refused(
                f"agent at {address} does not speak TLS, but the job's credential has a certificate "
                "(an agent of another job, or of an older mpilaunch)"
            )
        first = False
        try:
            done = link.handshake(data)
        except tls.TlsError as exc:
            raise _Refused(f"agent at {address} failed the TLS handshake (not the job's certificate?): {exc}") from None
        answer = link.take()
        if answer:
            sock.sendall(answer)
        if done:
            return


class _Busy(Exception):
    """The agent has too many connections waiting to authenticate; try again."""


class _Dropped(Exception):
    """The agent closed a handshake that took us too long (its HANDSHAKE_TIMEOUT, 3 s); try again.

    Seen with 64 kwok pods' agents and 64 shims starting at once on 2 cores: a
    starved shim's handshake outlived the agent's patience. A wrong secret is
    refused at once instead, and is not tried again.
    """


# A handshake the agent closed after this long was dropped for being slow, not refused: a wrong
# secret is refused within milliseconds. Measured from after the connect, while the agent counts its
# 3 s from the accept, so a shim starved in between (128 shims loading OpenSSL on 2 cores at once)
# sees much less than 3 s: 2.0 let such drops through as "wrong job secret" failures.
_SLOW_HANDSHAKE_S = 1.0


def _client_link(credential):
    """TLS for a credential with a certificate; else ``tls.PLAIN``, and OpenSSL is not even loaded."""
    if not credential.tls:
        return tls.PLAIN
    from mpilaunch.wire import tls_session

    try:
        return tls_session.client(credential)
    except tls.TlsError as exc:
        raise AgentError(f"the job's certificate does not load: {exc}") from None


def _handshake(address: str, secret: bytes, timeout: float, refused_wait: float = 0.0):
    """Connect, TLS where the credential has a certificate, and authenticate both ways.

    Returns ``(blocking socket, Channel, link, plaintext already received)``:
    ``link`` (``tls_session.Tls`` or ``tls.PLAIN``) encrypts and decrypts the session's bytes.
    """
    try:
        credential = tls.parse_credential(secret)
    except ValueError as exc:
        raise AgentError(str(exc)) from None
    sock = _connect(address, timeout, refused_wait)
    started = _monotonic()
    try:
        wire = _Wire(sock, _client_link(credential), address)
        key = credential.mac_key
        try:
            if credential.tls:
                _tls_handshake(wire)
            hello = wire.recv_exact(P.SERVER_HELLO_LEN)
            if hello == P.SERVER_BUSY:
                raise _Busy()
            try:
                server_nonce = P.parse_server_hello(hello)
            except P.ProtocolError as exc:
                raise AgentError(f"{address}: {exc}") from None
            client_nonce = P.new_nonce()
            wire.sendall(P.client_hello(key, server_nonce, client_nonce))
            proof = wire.recv_exact(P.MAC_LEN)
        except (_Busy, _Refused):
            raise
        except (AgentError, OSError):
            if _monotonic() - started >= _SLOW_HANDSHAKE_S:
                raise _Dropped() from None
            raise
        if not P.compare_digest(proof, P.server_proof(key, server_nonce, client_nonce)):
            raise AgentError(f"agent at {address} failed to prove it knows the job secret")
        channel = P.Channel(P.session_key(key, server_nonce, client_nonce), P.CLIENT)
        return sock, channel, wire.link, wire.buf
    except BaseException:
        sock.close()
        raise


def _open_session(address: str, secret: bytes, timeout: float, refused_wait: float = 0.0):
    """``_handshake``, tried again while the agent answers busy, for up to ``timeout`` seconds.

    An agent refuses a peer with more connections waiting to authenticate
    than its per-peer limit (a burst of clients on one host, or a hostile
    peer on ours): the clients back off and retry instead of failing. So does
    a client whose handshake the agent dropped for being slow (``_Dropped``).
    """
    try:
        return _handshake(address, secret, timeout, refused_wait)
    except (_Busy, _Dropped):
        pass
    deadline = _monotonic() + timeout
    delay = 0.01
    while True:
        # Jitter spreads a burst's retries; os.urandom spares importing random.
        pause = delay * (0.5 + os.urandom(1)[0] / 255)
        left = deadline - _monotonic()
        if left <= pause:
            raise AgentError(
                f"agent at {address} stayed busy for {timeout:g} s "
                "(too many connections waiting to authenticate, or a host too loaded to "
                "finish a handshake in time)"
            )
        select.select([], [], [], pause)
        try:
            return _handshake(address, secret, max(0.1, left - pause))
        except (_Busy, _Dropped):
            delay = min(delay * 2, 0.5)


def gone(address: str, timeout: float = 1.0) -> bool:
    """True when nothing listens at ``address`` (the connection is refused): the agent's process has
    ended, or its host restarted. A connection that times out is not gone: a slow host is no verdict."""
    try:
        _connect(address, timeout).close()
    except AgentError as exc:
        return isinstance(exc.__cause__, (ConnectionRefusedError, FileNotFoundError))
    return False


def ping(address: str, secret: bytes, timeout: float = 5.0) -> bool:
    """True when an agent answers an authenticated no-op at ``address``."""
    try:
        sock, channel, link, buf = _open_session(address, secret, timeout)
    except (AgentError, OSError, ValueError):
        return False
    try:
        sock.sendall(link.encrypt(channel.frame(P.PING)))
        while True:
            for ftype, _ in channel.pop_frames(buf, P.AGENT_TYPES):
                return ftype == P.PONG
            chunk = sock.recv(4096)
            if not chunk:
                return False
            buf += link.decrypt(chunk)
    except (OSError, P.ProtocolError, tls.TlsError):
        return False
    finally:
        sock.close()


class _Sink:
    """Where a remote stream goes: a file descriptor or a bytearray."""

    __slots__ = ("fd", "buf")

    def __init__(self, target):
        if isinstance(target, bytearray):
            self.fd, self.buf = None, target
        elif target is None:
            self.fd, self.buf = None, None  # discard
        else:
            self.fd = target if isinstance(target, int) else target.fileno()
            self.buf = None

    def write(self, data: bytes) -> None:
        if self.buf is not None:
            self.buf += data
        elif self.fd is not None:
            _write_all(self.fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            # mpirun may hand us a non-blocking pipe; wait instead of dropping.
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll(1000)
            continue
        except BrokenPipeError:
            return  # reader is gone; keep draining so the remote side is not stuck
        view = view[n:]


class _SignalForwarder:
    """Queue SIGINT/SIGTERM/SIGHUP so the run loop sends them to the agent."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self):
        import _signal

        self._signal = _signal
        self.pending = []
        self.rfd, self.wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._saved = {}
        self._saved_wakeup = _signal.set_wakeup_fd(self.wfd)
        for name in self.SIGNALS:
            num = getattr(_signal, name)
            self._saved[num] = _signal.signal(num, self._handle)

    def _handle(self, signum, _frame):
        self.pending.append(signum)

    def drain(self) -> list:
        try:
            while os.read(self.rfd, 512):
                pass
        except BlockingIOError:
            pass
        sigs, self.pending = self.pending, []
        return sigs

    def close(self):
        for num, handler in self._saved.items():
            self._signal.signal(num, handler)
        self._signal.set_wakeup_fd(self._saved_wakeup)
        os.close(self.rfd)
        os.close(self.wfd)


def run_command(
    address: str,
    secret: bytes,
    command: str,
    *,
    env: dict | None = None,
    cwd: str | None = None,
    stdin=None,
    stdout=1,
    stderr=2,
    timeout: float | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    forward_signals: bool = False,
    hangup_after_signal: float | None = None,
    refused_wait: float = 0.0,
) -> int:
    """Run ``/bin/sh -c command`` through the agent; return its exit status.

    ``stdin``: None (remote stdin is empty) or a file descriptor/file object
    to stream until EOF.  ``stdout``/``stderr``: a file descriptor, a file
    object, a ``bytearray`` to collect into, or None to discard.  Signals
    128+N mean the remote command died of signal N.  ``forward_signals``
    (main thread only) relays SIGINT/SIGTERM/SIGHUP to the remote session;
    with ``hangup_after_signal`` we give up waiting that many seconds after
    the first relayed signal and hang up (the agent then kills whatever is
    left of the session, e.g. background jobs that ignore SIGINT), returning
    128+signal.
    ``refused_wait``: how long a refused connection is tried again.
    Raises AgentError when the agent cannot be reached or the connection
    dies, TimeoutError after ``timeout`` seconds (the remote session is
    killed by the agent when we hang up).
    """
    deadline = None if timeout is None else _monotonic() + timeout
    forwarder = _SignalForwarder() if forward_signals else None
    try:
        sock, channel, link, inbuf = _open_session(address, secret, connect_timeout, refused_wait)
        try:
            return _run_loop(
                sock,
                channel,
                link,
                inbuf,
                address,
                command,
                env,
                cwd,
                stdin,
                stdout,
                stderr,
                deadline,
                forwarder,
                hangup_after_signal,
            )
        finally:
            sock.close()
    finally:
        if forwarder is not None:
            forwarder.close()


def run_capture(address: str, secret: bytes, command: str, **kwargs):
    """``run_command`` collecting output: returns ``(status, stdout, stderr)`` bytes."""
    out, err = bytearray(), bytearray()
    status = run_command(address, secret, command, stdout=out, stderr=err, **kwargs)
    return status, bytes(out), bytes(err)


def _monotonic() -> float:
    import time  # builtin module, only needed when a timeout is used

    return time.monotonic()


def _run_loop(
    sock, channel, link, inbuf, address, command, env, cwd, stdin, stdout, stderr, deadline, forwarder, hangup_after
):
    """``out`` holds wire bytes (frames as ``link`` encrypted them); ``inbuf`` plaintext not yet framed."""

    def frame(ftype, payload=b""):
        return link.encrypt(channel.frame(ftype, payload))

    out = bytearray(frame(P.RUN, P.encode_run(command, env, cwd)))
    stdin_fd = None
    if stdin is None:
        out += frame(P.STDIN)
    else:
        stdin_fd = stdin if isinstance(stdin, int) else stdin.fileno()
    sinks = {P.STDOUT: _Sink(stdout), P.STDERR: _Sink(stderr)}
    sock.setblocking(False)
    sfd = sock.fileno()
    poller = select.poll()
    POLLIN, POLLOUT = select.POLLIN, select.POLLOUT
    poller.register(sfd, POLLIN | POLLOUT)
    stdin_registered = False
    if stdin_fd is not None:
        poller.register(stdin_fd, POLLIN)
        stdin_registered = True
    if forwarder is not None:
        poller.register(forwarder.rfd, POLLIN)
        for signum in forwarder.drain():  # arrived before we were connected
            out += frame(P.SIGNAL, P.encode_int(signum))
    first_signal = None  # (signum, hang up at) once a signal was relayed
    while True:
        wait_ms = None
        if deadline is not None:
            left = deadline - _monotonic()
            if left <= 0:
                raise TimeoutError(f"remote command on {address} timed out")
            wait_ms = int(left * 1000) + 1
        if first_signal is not None:
            left = first_signal[1] - _monotonic()
            if left <= 0:
                return 128 + first_signal[0]  # closing the socket ends the session
            wait_ms = min(wait_ms if wait_ms is not None else 1 << 30, int(left * 1000) + 1)
        for fd, ev in poller.poll(wait_ms):
            if fd == sfd:
                if ev & (POLLIN | select.POLLHUP | select.POLLERR):
                    try:
                        data = sock.recv(P.CHUNK * 4)
                    except BlockingIOError:
                        data = None
                    except OSError as exc:
                        raise AgentError(f"connection to agent at {address} failed: {exc}") from None
                    if data == b"":
                        raise AgentError(f"lost connection to agent at {address}")
                    if data:
                        try:
                            inbuf += link.decrypt(data)
                            frames = channel.pop_frames(inbuf, P.AGENT_TYPES)
                        except (P.ProtocolError, tls.TlsError) as exc:
                            raise AgentError(f"agent at {address}: {exc}") from None
                        out += link.take()
                        for ftype, payload in frames:
                            sink = sinks.get(ftype)
                            if sink is not None:
                                sink.write(payload)
                            elif ftype == P.EXIT:
                                return P.decode_int(payload)
                            elif ftype == P.ERROR:
                                raise AgentError(payload.decode("utf-8", "replace"))
                if ev & POLLOUT and out:
                    try:
                        n = sock.send(out)
                    except BlockingIOError:
                        n = 0
                    except OSError as exc:
                        raise AgentError(f"connection to agent at {address} failed: {exc}") from None
                    del out[:n]
            elif fd == stdin_fd:
                try:
                    data = os.read(stdin_fd, P.CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if ev & select.POLLNVAL:
                    data = b""
                out += frame(P.STDIN, data)
                if not data:
                    poller.unregister(stdin_fd)
                    stdin_fd = None
                    stdin_registered = False
            elif forwarder is not None and fd == forwarder.rfd:
                for signum in forwarder.drain():
                    out += frame(P.SIGNAL, P.encode_int(signum))
                    if first_signal is None and hangup_after is not None:
                        first_signal = (signum, _monotonic() + hangup_after)
        # Back-pressure: stop reading stdin while the agent is not taking it.
        if stdin_fd is not None:
            if len(out) > _OUT_HIGH_WATER and stdin_registered:
                poller.unregister(stdin_fd)
                stdin_registered = False
            elif len(out) <= _OUT_HIGH_WATER and not stdin_registered:
                poller.register(stdin_fd, POLLIN)
                stdin_registered = True
        poller.modify(sfd, POLLIN | POLLOUT if out else POLLIN)
