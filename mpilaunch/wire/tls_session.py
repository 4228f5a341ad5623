"""One TLS connection of the agent channel, over memory buffers, with the standard library's ``_ssl``.

Why ``_ssl`` and not ``ssl``: the shim starts once per worker on mpirun's
path, and ``ssl.py`` costs ~20 ms there (``socket.py``, ``enum`` conversions of
every constant); ``_ssl`` itself is ~3 ms (it loads OpenSSL). The private
names used (``_SSLContext``, ``_wrap_bio``, ``MemoryBIO``) are what ``ssl.py``
builds its public classes from, unchanged from 3.7 to 3.13;
``tests/unit/test_tls_pieces.py`` fails loudly should one change. Memory BIOs
(not a wrapped socket) keep both event loops on plain sockets: a readable
socket means bytes to decrypt, and no plaintext hides in OpenSSL's buffers.
"""

from __future__ import annotations

import _ssl
import os

from .tls import TlsError, pem

# Decrypted bytes a read of one record can yield at most (TLS: 16 KiB).
_RECORD = 1 << 14


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


class Tls:
    """One TLS connection over memory buffers: the caller moves the wire bytes.

    ``handshake(wire_in)`` until it returns True, sending ``take()`` after
    each step; then ``encrypt``/``decrypt`` (and send ``take()`` after a
    ``decrypt`` too: TLS may answer a record, e.g. a key update). Raises
    ``TlsError`` on anything TLS refuses: a peer without the pinned
    certificate, a plain-text peer, a tampered record.
    """

    __slots__ = ("_in", "_out", "_obj", "_pinned")

    def __init__(self, ctx, server_side: bool, pinned: bytes | None = None):
        self._in = _ssl.MemoryBIO()
        self._out = _ssl.MemoryBIO()
        self._obj = ctx._wrap_bio(self._in, self._out, server_side, None)
        self._pinned = pinned

    def take(self) -> bytes:
        """Wire bytes TLS wants sent."""
        return self._out.read()

    def handshake(self, wire: bytes = b"") -> bool:
        """True once the handshake is done (and, on the client, the agent's certificate is the pinned one)."""
        if wire:
            self._in.write(wire)
        try:
            self._obj.do_handshake()
        except _ssl.SSLWantReadError:
            return False
        except _ssl.SSLError as exc:
            raise TlsError(_reason(exc)) from None
        if self._pinned is not None and self._obj.getpeercert(True) != self._pinned:
            # Belt and braces: OpenSSL already refuses any certificate but the one trust anchor.
            raise TlsError("the agent's certificate is not the job's")
        return True

    def encrypt(self, data: bytes) -> bytes:
        if data:
            try:
                self._obj.write(data)
            except _ssl.SSLError as exc:
                raise TlsError(_reason(exc)) from None
        return self._out.read()

    def decrypt(self, wire: bytes) -> bytes:
        """All the plaintext that ``wire`` completes (b"" while a record is still partial)."""
        self._in.write(wire)
        chunks = []
        while True:
            try:
                chunk = self._obj.read(_RECORD)
            except (_ssl.SSLWantReadError, _ssl.SSLZeroReturnError):  # ZeroReturn: the peer's close_notify
                break
            except _ssl.SSLError as exc:
                raise TlsError(_reason(exc)) from None
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _reason(exc) -> str:
    """OpenSSL's words (``certificate verify failed: self-signed certificate``), without the C file and line."""
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    return str(exc.reason or exc).lower().replace("_", " ")


def client(credential):
    """The client side of one connection: trusts ``credential``'s certificate, and only it."""
    try:
        ctx = client_context(credential.cert)
    except _ssl.SSLError as exc:
        raise TlsError(_reason(exc)) from None
    return Tls(ctx, False, pinned=credential.cert)
