"""Wire protocol between ``mpilaunch-rsh`` (client) and ``mpilaunch agent``.

This module sits on the shim's hot path (one shim process per worker, started
by mpirun, possibly hundreds at once), so it imports only C modules that are
already loaded or cost well under a millisecond: no ``hashlib``/``hmac``
(they load OpenSSL), no ``struct``, no ``json``.

Handshake (mutual HMAC-SHA256 challenge-response; the secret never crosses
the wire)::

    agent  -> client  SERVER_HELLO = MAGIC | VERSION | server_nonce(32)
                      (or SERVER_BUSY: too many connections are waiting to
                      authenticate; the client closes and tries again later)
    client -> agent   CLIENT_HELLO = MAGIC | VERSION | client_nonce(32)
                                     | HMAC(secret, CLIENT_LABEL | sn | cn)
    agent  -> client  SERVER_PROOF = HMAC(secret, SERVER_LABEL | sn | cn)

A wrong proof makes the agent close the connection without running anything;
the client checks the agent's proof before it sends the command (so a fake
agent learns neither the command nor the forwarded environment).

Both sides then derive a session key, HMAC(secret, KEY_LABEL | sn | cn), and
exchange frames through a :class:`Channel`::

    type(u8) | length(u32, big endian) | payload | tag(32)
    tag = HMAC(session key, direction(u8) | sequence(u64) | type | length | payload)

The sequence number is not sent: each side counts the frames it sent and
received, per direction, from 0.  So an on-path attacker who cannot compute
the key can neither change, inject, drop, reorder nor replay a frame (from
this session or another, whose key differs): the receiver fails the tag and
ends the session without acting on the frame.  Frames are authenticated
here, not encrypted: with a job's credential all of this runs inside TLS
(``tls.py``), and the MACs stay as a second, independent lock.

Payload at most ``MAX_FRAME`` bytes.  Client -> agent: one RUN or PING first,
then STDIN (empty payload = EOF) and SIGNAL.  Agent -> client: STARTED (or
ERROR), STDOUT/STDERR chunks, then EXIT (or PONG for a PING).
"""

from __future__ import annotations

import os

try:  # C implementation that ships with CPython; avoids importing OpenSSL.
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - Python 3.12+ merged it into _sha2
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:  # exotic builds
        from hashlib import sha256 as _sha256
from _operator import _compare_digest as compare_digest

MAGIC = b"MPLA"
VERSION = 2  # 2: every frame carries a tag (1 had none); a mismatch fails the handshake by name
NONCE_LEN = 32
MAC_LEN = 32
SERVER_HELLO_LEN = len(MAGIC) + 1 + NONCE_LEN
CLIENT_HELLO_LEN = len(MAGIC) + 1 + NONCE_LEN + MAC_LEN
CLIENT_LABEL = b"mpilaunch-agent client proof v1\0"
SERVER_LABEL = b"mpilaunch-agent server proof v1\0"
KEY_LABEL = b"mpilaunch-agent session key v2\0"
# Same length as SERVER_HELLO, so a client reads it in the same place; no
# real nonce is this string (2**-256).
SERVER_BUSY = MAGIC + bytes((VERSION,)) + b"busy".ljust(NONCE_LEN, b"\0")

HEADER_LEN = 5
MAX_FRAME = 1 << 20  # a RUN request with a large forwarded environment fits
CHUNK = 1 << 16  # stdio is read and framed in chunks of at most this size

# client -> agent
RUN = 0x01
PING = 0x02
STDIN = 0x03
SIGNAL = 0x04
# agent -> client
STARTED = 0x11
STDOUT = 0x12
STDERR = 0x13
EXIT = 0x14
ERROR = 0x15
PONG = 0x16

CLIENT_TYPES = frozenset((RUN, PING, STDIN, SIGNAL))
AGENT_TYPES = frozenset((STARTED, STDOUT, STDERR, EXIT, ERROR, PONG))


class ProtocolError(Exception):
    """The peer sent something that is not this protocol."""


# --- HMAC-SHA256 (RFC 2104), written out so the hot path skips hashlib ----

_BLOCK = 64
_OPAD = bytes((x ^ 0x5C) for x in range(256))
_IPAD = bytes((x ^ 0x36) for x in range(256))


class _KeyedHash:
    """HMAC-SHA256 under one key, with the padded key hashed once: each tag
    then costs two hash copies instead of two extra 64-byte blocks."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes):
        if len(key) > _BLOCK:
            key = _sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = _sha256(key.translate(_IPAD))
        self._outer = _sha256(key.translate(_OPAD))

    def digest(self, *parts: bytes) -> bytes:
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    return _KeyedHash(key).digest(msg)


def new_nonce() -> bytes:
    return os.urandom(NONCE_LEN)


def server_hello(server_nonce: bytes) -> bytes:
    return MAGIC + bytes((VERSION,)) + server_nonce


def parse_server_hello(data: bytes) -> bytes:
    """Return the server nonce, or raise ProtocolError."""
    if len(data) != SERVER_HELLO_LEN or data[:4] != MAGIC:
        raise ProtocolError("not an mpilaunch agent")
    if data[4] != VERSION:
        raise ProtocolError(f"agent speaks protocol version {data[4]}, expected {VERSION}")
    return bytes(data[5:])


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac_sha256(secret, CLIENT_LABEL + server_nonce + client_nonce)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac_sha256(secret, SERVER_LABEL + server_nonce + client_nonce)


def client_hello(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return MAGIC + bytes((VERSION,)) + client_nonce + client_proof(secret, server_nonce, client_nonce)


def check_client_hello(secret: bytes, server_nonce: bytes, data: bytes) -> bytes:
    """Verify a CLIENT_HELLO; return the client nonce or raise ProtocolError."""
    if len(data) != CLIENT_HELLO_LEN or data[:4] != MAGIC:
        raise ProtocolError("bad hello")
    if data[4] != VERSION:
        raise ProtocolError(f"client speaks protocol version {data[4]}")
    client_nonce = bytes(data[5 : 5 + NONCE_LEN])
    proof = bytes(data[5 + NONCE_LEN :])
    if not compare_digest(proof, client_proof(secret, server_nonce, client_nonce)):
        raise ProtocolError("bad credentials")
    return client_nonce


def session_key(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The key that authenticates one session's frames: fresh for every pair of nonces."""
    return hmac_sha256(secret, KEY_LABEL + server_nonce + client_nonce)


# --- frames -----------------------------------------------------------------

CLIENT = b"C"  # direction of frames the client sends
AGENT = b"A"  # direction of frames the agent sends


def _header(ftype: int, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {MAX_FRAME}")
    return bytes((ftype,)) + len(payload).to_bytes(4, "big")


class Channel:
    """One authenticated session's frames, for one side (``CLIENT`` or ``AGENT``).

    ``frame`` tags what this side sends; ``pop_frames`` verifies what the
    other side sent, in order.  The direction is in the tag so a frame
    cannot be reflected back to its sender.
    """

    __slots__ = ("_mac", "_send_dir", "_recv_dir", "sent", "received")

    def __init__(self, key: bytes, side: bytes):
        if side not in (CLIENT, AGENT):
            raise ValueError(f"side must be CLIENT or AGENT, not {side!r}")
        self._mac = _KeyedHash(key)
        self._send_dir = side
        self._recv_dir = AGENT if side == CLIENT else CLIENT
        self.sent = 0
        self.received = 0

    def _tag(self, direction: bytes, seq: int, header: bytes, payload: bytes) -> bytes:
        return self._mac.digest(direction, seq.to_bytes(8, "big"), header, payload)

    def frame(self, ftype: int, payload: bytes = b"") -> bytes:
        """The next frame to send: header, payload and its tag."""
        header = _header(ftype, payload)
        tag = self._tag(self._send_dir, self.sent, header, payload)
        self.sent += 1
        return header + payload + tag

    def pop_frames(self, buf: bytearray, allowed: frozenset) -> list:
        """Remove every complete frame from the front of ``buf``; ``[(type, payload), ...]``.

        Raises ProtocolError on an unknown type or a length above MAX_FRAME
        (before buffering any such payload), and on a frame whose tag does
        not verify; nothing is returned then, not even the frames before it,
        so a caller acts on no frame of a batch that was tampered with.
        """
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_LEN:
            ftype = buf[pos]
            if ftype not in allowed:
                raise ProtocolError(f"unexpected frame type 0x{ftype:02x}")
            length = int.from_bytes(buf[pos + 1 : pos + HEADER_LEN], "big")
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
            start = pos + HEADER_LEN
            stop = start + length
            if end < stop + MAC_LEN:
                break
            payload = bytes(buf[start:stop])
            expected = self._tag(self._recv_dir, self.received, bytes(buf[pos:start]), payload)
            if not compare_digest(bytes(buf[stop : stop + MAC_LEN]), expected):
                raise ProtocolError("frame failed authentication (altered, injected, replayed or out of order)")
            self.received += 1
            frames.append((ftype, payload))
            pos = stop + MAC_LEN
        if pos:
            del buf[:pos]
        return frames


# --- payloads ---------------------------------------------------------------
# RUN payload: NUL-separated fields "cmd \0 cwd \0 K=V \0 K=V ...".  NUL can
# appear in none of them (execve forbids it), and it spares the shim ``json``.


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def encode_run(command: str, env: dict | None = None, cwd: str | None = None) -> bytes:
    fields = [_enc(command), _enc(cwd or "")]
    for key, value in (env or {}).items():
        fields.append(_enc(key) + b"=" + _enc(value))
    for field in fields:
        if b"\0" in field:
            raise ValueError("command, cwd and environment may not contain NUL bytes")
    return b"\0".join(fields)


def decode_run(payload: bytes):
    """Return ``(command, env, cwd)`` or raise ProtocolError."""
    fields = [f.decode("utf-8", "surrogateescape") for f in payload.split(b"\0")]
    if len(fields) < 2 or not fields[0]:
        raise ProtocolError("malformed run request")
    env = {}
    for item in fields[2:]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ProtocolError("malformed environment entry in run request")
        env[key] = value
    return fields[0], env, (fields[1] or None)


def encode_int(value: int) -> bytes:
    return value.to_bytes(4, "big", signed=True)


def decode_int(payload: bytes) -> int:
    if len(payload) != 4:
        raise ProtocolError("malformed integer frame")
    return int.from_bytes(payload, "big", signed=True)


def encode_started(session_id: str, pid: int) -> bytes:
    return f"{session_id}\0{pid}".encode()


def decode_started(payload: bytes):
    session_id, _, pid = payload.decode("utf-8", "replace").partition("\0")
    return session_id, int(pid or 0)


def exit_code_from_wait_status(status: int) -> int:
    """Shell convention: normal exit -> its code, death by signal N -> 128+N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


#: an agent address that is a Unix socket: ``unix:/path`` (a file), ``unix:@name`` (Linux's abstract namespace)
UNIX_PREFIX = "unix:"


def unix_sockaddr(address: str):
    """What ``connect``/``bind`` take for a ``unix:`` address (abstract: a leading NUL); None for TCP."""
    if not address.startswith(UNIX_PREFIX):
        return None
    path = address[len(UNIX_PREFIX) :]
    if not path or "\0" in path:
        raise ValueError(f"bad agent address {address!r}, expected unix:/PATH or unix:@NAME")
    return "\0" + path[1:] if path.startswith("@") else path


def unix_address(sockaddr) -> str:
    """The ``unix:`` address of a bound Unix socket's name (``getsockname``: str, or bytes when abstract)."""
    if isinstance(sockaddr, bytes):
        sockaddr = sockaddr.decode("utf-8", "surrogateescape")
    return UNIX_PREFIX + ("@" + sockaddr[1:] if sockaddr.startswith("\0") else sockaddr)


def parse_address(address: str):
    """``host:port`` or ``[v6]:port`` -> ``(host, port)`` (a ``unix:`` address is ``unix_sockaddr``'s)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad agent address {address!r}, expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
