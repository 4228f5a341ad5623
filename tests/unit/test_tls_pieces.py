"""The agent channel's TLS pieces without an agent: the credential line, the certificate, pinning,
and the private ``_ssl`` names the shim uses instead of ``ssl.py`` (``wire/tls.py``,
``tls_session.py``)."""

from __future__ import annotations

import _ssl
import datetime

import pytest

from mpilaunch.backends.agent_credential import new_credential, new_mac_secret, self_signed_certificate
from mpilaunch.wire import tls, tls_session


def handshake(client, server) -> None:
    client.handshake()
    wire = client.take()
    for _ in range(5):
        server.handshake(wire)
        done = client.handshake(server.take())
        wire = client.take()
        if done:
            assert server.handshake(wire)
            return
    raise AssertionError("the handshake did not finish")


def serving(cert, key):
    return tls_session.Tls(tls_session.server_context(cert, key), True)


def pair():
    credential = tls.parse_credential(new_credential().encode())
    return tls_session.client(credential), serving(credential.cert, credential.key)


def test_tls_private_ssl_names_the_shim_relies_on_exist():
    # ssl.py builds SSLContext/SSLObject from exactly these; a Python that renames one fails here first.
    for name in (
        "_SSLContext",
        "MemoryBIO",
        "SSLError",
        "SSLWantReadError",
        "SSLZeroReturnError",
        "PROTO_TLSv1_3",
        "PROTOCOL_TLS_CLIENT",
        "PROTOCOL_TLS_SERVER",
        "CERT_REQUIRED",
    ):
        assert hasattr(_ssl, name), name
    assert hasattr(_ssl._SSLContext, "_wrap_bio")


def test_tls_credential_line_round_trips_and_a_plain_secret_has_no_tls():
    line = new_credential()
    assert "\n" not in line and line.count(":") == 2
    credential = tls.parse_credential(line.encode())
    assert credential.tls and len(credential.mac_key) == 64
    plain = tls.parse_credential(b"0123abcd")
    assert (plain.mac_key, plain.tls) == (b"0123abcd", False)
    for bad in (b"a:b", b"a::c", b"a:b:c:d", b"s:not base64!:x"):
        with pytest.raises(ValueError, match="malformed agent credential"):
            tls.parse_credential(bad)


def test_tls_unix_socket_agents_get_a_fresh_mac_secret_without_a_certificate():
    """The local backend's agents (Unix sockets only): the MACs' 32 random bytes, no TLS to set up."""
    first, second = new_mac_secret(), new_mac_secret()
    credential = tls.parse_credential(first.encode())
    assert (credential.tls, len(credential.mac_key)) == (False, 64) and first != second
    int(first, 16)  # hex, as new_credential's MAC part


def test_tls_each_job_gets_its_own_certificate_valid_across_clock_skew():
    from cryptography import x509

    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    cert_a, key_a = self_signed_certificate(now)
    cert_b, key_b = self_signed_certificate(now)
    assert cert_a != cert_b and key_a != key_b
    cert = x509.load_der_x509_certificate(cert_a)
    assert cert.not_valid_before_utc <= now - datetime.timedelta(hours=23)
    assert cert.not_valid_after_utc >= now + datetime.timedelta(days=365 * 5)


def test_tls_hand_written_certificate_is_one_that_cryptography_reads_and_verifies():
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    for now in (
        datetime.datetime(2026, 11, 27, 20, 0, tzinfo=datetime.timezone.utc),
        datetime.datetime(2049, 6, 1, tzinfo=datetime.timezone.utc),
    ):  # its end in GeneralizedTime
        der, key_der = self_signed_certificate(now)
        cert = x509.load_der_x509_certificate(der)
        key = serialization.load_der_private_key(key_der, None)
        assert cert.version == x509.Version.v3 and cert.serial_number > 0
        assert cert.subject == cert.issuer and cert.subject.rfc4514_string() == "CN=mpilaunch-agent"
        assert cert.public_key().public_numbers() == key.public_key().public_numbers()
        assert isinstance(key.curve, ec.SECP256R1)
        cert.verify_directly_issued_by(cert)  # its signature is over exactly its TBS bytes
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
        assert constraints.critical and constraints.value.ca is False
        assert cert.not_valid_before_utc == now - datetime.timedelta(days=1)
        assert cert.not_valid_after_utc == now + datetime.timedelta(days=3650)
        assert cert.public_bytes(serialization.Encoding.DER) == der  # DER, not just BER


def test_tls_der_lengths_and_integers():
    from mpilaunch.backends import selfsigned

    assert selfsigned.tlv(0x04, b"x" * 5) == b"\x04\x05" + b"x" * 5
    assert selfsigned.tlv(0x04, b"x" * 200)[:3] == b"\x04\x81\xc8"
    assert selfsigned.tlv(0x04, b"x" * 300)[:4] == b"\x04\x82\x01\x2c"
    assert selfsigned.positive_integer(b"\x80") == b"\x02\x02\x00\x80"
    assert selfsigned.positive_integer(b"\x00\x00\x7f") == b"\x02\x01\x7f"


def test_tls_records_carry_no_plaintext_and_tampering_fails():
    client, server = pair()
    handshake(client, server)
    wire = client.encrypt(b"TLS_MARK=very-secret-value")
    assert b"very-secret" not in wire
    assert server.decrypt(wire) == b"TLS_MARK=very-secret-value"
    big = server.encrypt(b"x" * 100_000)  # several records, decrypted in one go
    assert client.decrypt(big[:1000]) == b""  # a partial record yields nothing yet
    assert client.decrypt(big[1000:]) == b"x" * 100_000
    tampered = bytearray(client.encrypt(b"echo hi"))
    tampered[-1] ^= 1
    with pytest.raises(tls.TlsError):
        server.decrypt(bytes(tampered))


def test_tls_client_pins_the_exact_certificate_not_whatever_its_key_signed():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    credential = tls.parse_credential(new_credential().encode())
    # Another job's certificate: not the trust anchor.
    other = tls.parse_credential(new_credential().encode())
    client = tls_session.client(credential)
    with pytest.raises(tls.TlsError, match="certificate verify failed"):
        handshake(client, serving(other.cert, other.key))
    # The job's own key with a different certificate (the same name and key, a new serial):
    # OpenSSL refuses it already (not the trusted certificate) ...
    key = serialization.load_der_private_key(credential.key, None)
    original = x509.load_der_x509_certificate(credential.cert)
    twin = (
        x509.CertificateBuilder()
        .subject_name(original.subject)
        .issuer_name(original.issuer)
        .public_key(key.public_key())
        .serial_number(original.serial_number + 1)
        .not_valid_before(original.not_valid_before_utc)
        .not_valid_after(original.not_valid_after_utc)
        .sign(key, hashes.SHA256())
    ).public_bytes(serialization.Encoding.DER)
    with pytest.raises(tls.TlsError, match="certificate verify failed"):
        handshake(tls_session.client(credential), serving(twin, credential.key))
    # ... and the pin refuses it even where a chain check let it through.
    lenient = tls_session.Tls(tls_session.client_context(twin), False, pinned=credential.cert)
    with pytest.raises(tls.TlsError, match="not the job's"):
        handshake(lenient, serving(twin, credential.key))
