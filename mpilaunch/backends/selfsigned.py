"""A minimal self-signed X.509 v3 certificate, its DER written out by hand.

Why not ``cryptography.x509``'s builder: importing ``cryptography.x509``
costs a launch about as much again as the key's own modules (~60 ms of
~120 ms measured on the 2-core VM under load), and a job needs one
certificate of a fixed shape: a name, two dates, a public key, "not a CA".
The caller signs (``sign(tbs) -> DER ECDSA signature``), so this module is
pure. ``tests/unit/test_tls_pieces.py`` parses the result with
``cryptography`` and checks its signature, and every TLS test uses it.
"""

from __future__ import annotations

import datetime

# OIDs, DER-encoded (tag, length, value)
_ECDSA_WITH_SHA256 = bytes.fromhex("06082a8648ce3d040302")  # 1.2.840.10045.4.3.2
_COMMON_NAME = bytes.fromhex("0603550403")  # 2.5.4.3
_BASIC_CONSTRAINTS = bytes.fromhex("0603551d13")  # 2.5.29.19

_SEQUENCE, _SET, _INTEGER, _BIT_STRING, _OCTET_STRING, _BOOLEAN = 0x30, 0x31, 0x02, 0x03, 0x04, 0x01
_UTF8_STRING, _UTC_TIME, _GENERALIZED_TIME = 0x0C, 0x17, 0x18


def tlv(tag: int, content: bytes) -> bytes:
    """One DER element: tag, definite length (short or long form), content."""
    n = len(content)
    if n < 0x80:
        return bytes((tag, n)) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + content


def seq(*parts: bytes) -> bytes:
    return tlv(_SEQUENCE, b"".join(parts))


def positive_integer(raw: bytes) -> bytes:
    """A DER INTEGER of ``raw`` read as unsigned: a leading zero octet where the top bit is set."""
    raw = raw.lstrip(b"\0") or b"\0"
    return tlv(_INTEGER, b"\0" + raw if raw[0] & 0x80 else raw)


def name(common_name: str) -> bytes:
    return seq(tlv(_SET, seq(_COMMON_NAME, tlv(_UTF8_STRING, common_name.encode()))))


def time_value(when: datetime.datetime) -> bytes:
    """RFC 5280: UTCTime through 2049, GeneralizedTime from 2050."""
    when = when.astimezone(datetime.timezone.utc)
    if when.year < 2050:
        return tlv(_UTC_TIME, when.strftime("%y%m%d%H%M%SZ").encode())
    return tlv(_GENERALIZED_TIME, when.strftime("%Y%m%d%H%M%SZ").encode())


def not_a_ca() -> bytes:
    """basicConstraints, critical, cA FALSE (the default, so an empty SEQUENCE): the job's certificate
    can sign no other, so a key holder cannot mint a second one that chains to it."""
    return seq(_BASIC_CONSTRAINTS, tlv(_BOOLEAN, b"\xff"), tlv(_OCTET_STRING, seq()))


def tbs_certificate(
    common_name: str, serial: bytes, not_before: datetime.datetime, not_after: datetime.datetime, public_key_info: bytes
) -> bytes:
    """The to-be-signed part: v3, ECDSA-SHA256, issuer = subject, one extension."""
    return seq(
        tlv(0xA0, positive_integer(b"\x02")),  # [0] EXPLICIT version: v3
        positive_integer(serial),
        seq(_ECDSA_WITH_SHA256),
        name(common_name),
        seq(time_value(not_before), time_value(not_after)),
        name(common_name),
        public_key_info,  # SubjectPublicKeyInfo, DER as the key library writes it
        tlv(0xA3, seq(not_a_ca())),  # [3] EXPLICIT extensions
    )


def certificate(tbs: bytes, signature: bytes) -> bytes:
    """The signed certificate: ``signature`` is the DER ECDSA-Sig-Value over ``tbs`` with SHA-256."""
    return seq(tbs, seq(_ECDSA_WITH_SHA256), tlv(_BIT_STRING, b"\0" + signature))
