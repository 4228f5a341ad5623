"""TLS under the agent protocol: the job's credential, and a TLS session over memory buffers.

The job's agent credential is one line, so that every way the secret already
travels (a 0600 file, an agent's stdin, skein's key-value store, a
Kubernetes Secret) carries the certificate with it unchanged::

    <hex MAC secret>:<base64 DER certificate>:<base64 DER PKCS#8 key>

A line without ``:`` is a MAC secret alone: no TLS (agents and clients
started by hand, older tests). Both sides read the same line, so they agree
on TLS without negotiating it, and nobody on the path can downgrade them.

The certificate is self-signed and made for one job (``backends/credential``).
The client pins it: it is the only trust anchor, and the agent must present
exactly it. The agent asks for no client certificate: the protocol's
challenge-response under the MAC secret (``protocol.py``) already makes the
client prove it holds the job's credential, with fresh nonces, before
anything runs; a client certificate would prove the same thing again and
cost every shim a private-key load and a signature. The frame MACs stay
(defence in depth: a TLS bug alone does not let anyone run a command).

Why ``_ssl`` and not ``ssl``: the shim starts once per worker on mpirun's
path, and ``ssl.py`` costs ~20 ms there (``socket.py``, ``enum`` conversions of
every constant); ``_ssl`` itself is ~3 ms (it loads OpenSSL). The private
names used (``_SSLContext``, ``_wrap_bio``, ``MemoryBIO``) are what ``ssl.py``
builds its public classes from, unchanged from 3.7 to 3.13;
``tests/unit/test_agent_tls.py`` fails loudly should one change. Memory BIOs
(not a wrapped socket) keep both event loops on plain sockets: a readable
socket means bytes to decrypt, and no plaintext hides in OpenSSL's buffers.
"""

from __future__ import annotations

import os
from binascii import a2b_base64, b2a_base64

import _ssl

SEPARATOR = b":"
# Decrypted bytes a read of one record can yield at most (TLS: 16 KiB).
_RECORD = 1 << 14

SSLError = _ssl.SSLError


class Credential:
    """The job's agent credential, split: ``mac_key`` always; ``cert``/``key`` (DER) with TLS."""

    __slots__ = ("mac_key", "cert", "key")

    def __init__(self, mac_key: bytes, cert: bytes | None = None, key: bytes | None = None):
        self.mac_key = mac_key
        self.cert = cert
        self.key = key

    @property
    def tls(self) -> bool:
        return self.cert is not None


def format_credential(mac_secret: str, cert_der: bytes, key_der: bytes) -> str:
    """The one-line credential for a MAC secret (hex) and a DER certificate and PKCS#8 key."""
    return ":".join((mac_secret, _b64(cert_der), _b64(key_der)))


def parse_credential(line: bytes) -> Credential:
    """Split a credential line (what ``agent_client.read_secret`` returns); ValueError if malformed."""
    if SEPARATOR not in line:
        return Credential(line)
    parts = line.split(SEPARATOR)
    if len(parts) != 3 or not all(parts):
        raise ValueError("malformed agent credential (expected SECRET:CERT:KEY)")
    try:
        return Credential(parts[0], a2b_base64(parts[1]), a2b_base64(parts[2]))
    except ValueError:
        raise ValueError("malformed agent credential (its certificate or key is not base64)") from None


def _b64(data: bytes) -> str:
    return b2a_base64(data, newline=False).decode("ascii")


def pem(label: str, der: bytes) -> bytes:
    """PEM armour, 64 columns (what OpenSSL's PEM reader expects)."""
    body = _b64(der)
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return ("\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"]) + "\n").encode("ascii")


# --- contexts ---------------------------------------------------------------


def _context(protocol: int):
    ctx = _ssl._SSLContext(protocol)
    # Both ends are ours: TLS 1.3 only (AEAD ciphers, one round trip, no renegotiation).
    ctx.minimum_version = _ssl.PROTO_TLSv1_3
    return ctx


def client_context(cert_der: bytes):
    """Trusts the job's certificate and nothing else (no system CAs, no host name: pods' names vary)."""
    ctx = _context(_ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = _ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=cert_der)
    return ctx


def server_context(cert_der: bytes, key_der: bytes):
    """The agent's context, holding the job's certificate and key; it asks clients for none."""
    ctx = _context(_ssl.PROTOCOL_TLS_SERVER)
    ctx.num_tickets = 0  # every connection is new: resumption tickets would be bytes nobody uses
    _load_cert_chain(ctx, pem("CERTIFICATE", cert_der), pem("PRIVATE KEY", key_der))
    return ctx


def _load_cert_chain(ctx, cert_pem: bytes, key_pem: bytes) -> None:
    """``load_cert_chain`` reads only from paths: hand it pipes, so the key never touches a disk
    (a Kubernetes pod may have a read-only root and no writable /tmp of its own)."""
    pipes = []
    try:
        for data in (cert_pem, key_pem):
            r, w = os.pipe()
            pipes += [r, w]
            os.write(w, data)  # a few hundred bytes: far below a pipe's buffer
            os.close(w)
            pipes.remove(w)
        ctx.load_cert_chain(f"/dev/fd/{pipes[0]}", f"/dev/fd/{pipes[1]}")
    finally:
        for fd in pipes:
            os.close(fd)


# --- one connection's TLS ---------------------------------------------------


class Plain:
    """No TLS (a credential without a certificate): bytes pass through unchanged."""

    __slots__ = ()
    handshake_done = True

    def encrypt(self, data: bytes) -> bytes:
        return data

    def decrypt(self, data: bytes) -> bytes:
        return data

    def take(self) -> bytes:
        return b""


PLAIN = Plain()


class Tls:
    """One TLS connection over memory buffers: the caller moves the wire bytes.

    ``handshake(wire_in)`` until ``handshake_done``, sending ``take()`` after
    each step; then ``encrypt``/``decrypt`` (and send ``take()`` after a
    ``decrypt`` too: TLS may answer a record, e.g. a key update). Raises ``SSLError`` on anything
    TLS refuses (a peer without the pinned certificate, a plain-text peer,
    a tampered record).
    """

    __slots__ = ("_in", "_out", "_obj", "handshake_done", "_pinned")

    def __init__(self, ctx, server_side: bool, pinned: bytes | None = None):
        self._in = _ssl.MemoryBIO()
        self._out = _ssl.MemoryBIO()
        self._obj = ctx._wrap_bio(self._in, self._out, server_side, None)
        self._pinned = pinned
        self.handshake_done = False

    def take(self) -> bytes:
        """Wire bytes TLS wants sent."""
        return self._out.read()

    def handshake(self, wire: bytes = b"") -> bool:
        if wire:
            self._in.write(wire)
        try:
            self._obj.do_handshake()
        except _ssl.SSLWantReadError:
            return False
        if self._pinned is not None and self._obj.getpeercert(True) != self._pinned:
            # The CA check alone would accept any certificate that this one signed.
            raise SSLError("the agent's certificate is not the job's")
        self.handshake_done = True
        return True

    def encrypt(self, data: bytes) -> bytes:
        if data:
            self._obj.write(data)
        return self._out.read()

    def decrypt(self, wire: bytes) -> bytes:
        """All the plaintext that ``wire`` completes (b"" while a record is still partial)."""
        self._in.write(wire)
        chunks = []
        while True:
            try:
                chunk = self._obj.read(_RECORD)
            except _ssl.SSLWantReadError:
                break
            except _ssl.SSLZeroReturnError:  # the peer's close_notify: its end of data
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def client(credential: Credential):
    """The client side of one connection for ``credential``: ``PLAIN`` without a certificate."""
    if not credential.tls:
        return PLAIN
    return Tls(client_context(credential.cert), False, pinned=credential.cert)


def looks_like_tls(first_byte: int) -> bool:
    """A TLS record starts with its content type: handshake (22) or alert (21)."""
    return first_byte in (21, 22)
