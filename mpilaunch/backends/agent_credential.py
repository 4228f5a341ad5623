"""A job's agent credential: a MAC secret and a self-signed certificate made for this job alone.

Made once per job on the submitting side; the line (``wire/tls.py``
has its format) then travels wherever the secret always went, and the
agents serve TLS with it while the shims pin it.

``cryptography`` is imported here only, when a job starts: the shims and
agents need nothing but the standard library's ``_ssl``.
"""

from __future__ import annotations

import datetime
import os

from ..core.errors import UsageError
from ..wire.tls import format_credential
from . import selfsigned

# The certificate is pinned, not chained, so its dates only have to admit
# every clock of the job: a day back for a worker whose clock is behind this
# machine's, and long enough for any detached job.
VALID_BEFORE = datetime.timedelta(days=1)
VALID_FOR = datetime.timedelta(days=3650)
COMMON_NAME = "mpilaunch-agent"


def new_credential() -> str:
    """A fresh credential line: 32 random bytes (hex) for the MACs, an ECDSA P-256 key and its certificate."""
    cert, key = self_signed_certificate()
    # os.urandom, not secrets: importing secrets (hmac, hashlib) costs a launch for nothing
    return format_credential(os.urandom(32).hex(), cert, key)


def new_mac_secret() -> str:
    """A credential of a MAC secret alone (``tls.parse_credential``: no certificate, no TLS), for
    agents on Unix sockets: such a socket is on no network, so there is no wire for TLS to hide
    anything on (another user cannot read a Unix socket's traffic; one who could, root, can read the
    secret file too), and the challenge-response still makes each side prove it holds the secret.
    Making and loading a certificate was ~25 ms of CPU of a 4-rank local launch (the key, OpenSSL
    in each shim and agent, a handshake per connection): BENCHMARKS.md, "End-to-end launch"."""
    return os.urandom(32).hex()


def self_signed_certificate(now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """(DER certificate, DER PKCS#8 key): P-256 because a key is made in well under a millisecond
    (RSA takes tens) and every TLS 1.3 stack signs with it. The certificate is written out by
    ``selfsigned`` (``cryptography.x509`` alone would double what this costs a launch)."""
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise UsageError(
            f"the agent channel's TLS needs the 'cryptography' package ({exc})",
            "pip install cryptography (a dependency of mpilaunch: reinstall it)",
        ) from None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    public_key_info = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    tbs = selfsigned.tbs_certificate(COMMON_NAME, os.urandom(16), now - VALID_BEFORE, now + VALID_FOR, public_key_info)
    cert = selfsigned.certificate(tbs, key.sign(tbs, ec.ECDSA(hashes.SHA256())))
    return cert, key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
