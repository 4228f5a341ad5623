"""TLS under the agent protocol: the job's credential, and a TLS session over memory buffers.

The job's agent credential is one line, so that every way the secret already
travels (a 0600 file, an agent's stdin, skein's key-value store, a
Kubernetes Secret) carries the certificate with it unchanged::

    <hex MAC secret>:<base64 DER certificate>:<base64 DER PKCS#8 key>

A line without ``:`` is a MAC secret alone: no TLS (agents and clients
started by hand, older tests). Both sides read the same line, so they agree
on TLS without negotiating it, and nobody on the path can downgrade them.

The certificate is self-signed and made for one job (``backends/agent_credential.py``).
The client pins it: it is the only trust anchor, and the agent must present
exactly it. The agent asks for no client certificate: the protocol's
challenge-response under the MAC secret (``protocol.py``) already makes the
client prove it holds the job's credential, with fresh nonces, before
anything runs; a client certificate would prove the same thing again and
cost every shim a private-key load and a signature. The frame MACs stay
(defence in depth: a TLS bug alone does not let anyone run a command).

The TLS session itself is ``tls_session.py``, imported only for a
credential with a certificate (it loads OpenSSL).
"""

from __future__ import annotations

from binascii import a2b_base64, b2a_base64

SEPARATOR = b":"


class TlsError(Exception):
    """TLS refused the peer (not the job's certificate, no TLS at all) or a record (tampered)."""


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


# --- one connection's TLS ---------------------------------------------------


class Plain:
    """No TLS (a credential without a certificate): bytes pass through unchanged."""

    __slots__ = ()

    def encrypt(self, data: bytes) -> bytes:
        return data

    def decrypt(self, data: bytes) -> bytes:
        return data

    def take(self) -> bytes:
        return b""


PLAIN = Plain()


def looks_like_tls(first_byte: int) -> bool:
    """A TLS record starts with its content type: handshake (22) or alert (21)."""
    return first_byte in (21, 22)
