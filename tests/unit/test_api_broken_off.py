"""An API server that goes away in the middle of an answer is an outage, not a crash.

Seen on the real node's testbed: the API server's port answering with TCP resets for 25 s during an
attached job (test_reaper_outage_…[refusing]) cut a pod read mid-chunk; http.client raised
IncompleteRead, which is no OSError, and mpilaunch died with a traceback instead of riding the outage
out. A real TLS server here sends half a chunked answer and closes.
"""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from mpilaunch.backends.agent_credential import self_signed_certificate
from mpilaunch.backends.k8s.api import Api
from mpilaunch.backends.k8s.follow import follow_log


def half_answer_server(tmp_path, answers: int = 1) -> tuple[int, threading.Thread, list]:
    from cryptography.hazmat.primitives import serialization

    cert_der, key_der = self_signed_certificate()
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text(ssl.DER_cert_to_PEM_cert(cert_der))
    private = serialization.load_der_private_key(key_der, None)
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    served = []

    def serve():
        with listener:
            for _ in range(answers):
                raw, _ = listener.accept()
                with ctx.wrap_socket(raw, server_side=True) as tls:
                    tls.recv(65536)
                    tls.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"400\r\n" + b'2026-12-07T00:00:00Z {"kind": "Pod", "metadata": {' + b" " * 100
                    )
                served.append(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, served


def test_an_answer_cut_mid_chunk_is_an_oserror_the_callers_ride_out(tmp_path):
    port, server, _ = half_answer_server(tmp_path)
    api = Api({"server": f"https://127.0.0.1:{port}", "insecure": True, "token": "t"}, timeout=10)
    with pytest.raises(OSError, match="broke off"):
        api.get("v1", "pods", "p")
    server.join(timeout=10)


def test_the_launcher_log_follower_survives_streams_cut_mid_chunk(tmp_path):
    """The follower reads a streamed answer itself: a stream cut mid-chunk is resumed, not a dead thread."""
    port, server, served = half_answer_server(tmp_path, answers=2)
    api = Api({"server": f"https://127.0.0.1:{port}", "insecure": True, "token": "t"}, timeout=10)
    stop, errors = threading.Event(), []

    class Output:
        def feed(self, stream, text):
            pass

    def follow():
        try:
            follow_log(api, "default", "p", Output(), stop)
        except BaseException as e:  # what killed the thread
            errors.append(e)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    server.join(timeout=20)
    stop.set()
    follower.join(timeout=20)
    assert errors == [] and len(served) == 2 and not follower.is_alive()
