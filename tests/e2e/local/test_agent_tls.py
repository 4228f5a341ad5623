"""The agent channel is encrypted (issue 40 item 8): TLS pinned to a certificate made for the job.

What crosses the agent's socket is captured on loopback (``support/capture.py``,
a raw packet socket: root), for a real local job and for a plain-text agent
beside a TLS one (so the capture is shown to see what it is asked to find).
Clients without the job's certificate are real clients of real agents;
"nothing ran" is proven with commands that would create a marker.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys

import pytest

from mpilaunch.rsh_agent import agent_client
from mpilaunch.wire import protocol as P
from mpilaunch.wire import tls
from support.agent import SECRET, AgentProc, tls_credential
from support.capture import capture_or_require
from support.helpers import leftover_processes, run_mpilaunch


def marker() -> str:
    return "tls-marker-" + os.urandom(8).hex()


def tls_records(flows: dict) -> list:
    """Connections whose client spoke first with a TLS handshake record (a ClientHello)."""
    return [k for k, v in flows.items() if v[:3] == b"\x16\x03\x01" and len(v) > 5 and v[5] == 1]


def test_tls_job_keeps_x_values_and_task_output_off_the_wire(tmp_path):
    """A real local PS job: its ``-x`` value goes to the task through the agent channel (the
    starter's environment, on its stdin) and the task's output comes back through it."""
    secret, name = marker(), "tls-ps"
    reversed_secret = secret[::-1]
    with capture_or_require() as cap:
        proc = run_mpilaunch(
            [
                "--name",
                name,
                "--mode",
                "ps",
                "--workers",
                "2",
                "-x",
                f"TLS_MARK={secret}",
                "--",
                sys.executable,
                "-c",
                "import os; print(os.environ['TLS_MARK'][::-1])",
            ],
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[worker:0] {reversed_secret}" in proc.stdout  # the value reached the task, the output came back
    assert f"[worker:1] {reversed_secret}" in proc.stdout
    # Local agents listen on Unix sockets in the job's run directory (issue 49 item 11): the channel
    # is on no network at all, so loopback carries neither the value nor the output (the capture is
    # shown to see an agent's bytes by the next test, over TCP, where TLS hides them).
    assert cap.contains(secret.encode()) == [] and cap.contains(reversed_secret.encode()) == []
    assert leftover_processes(name) == []


def test_tls_capture_sees_a_plain_agent_s_bytes_and_not_a_tls_one(tmp_path):
    """The same capture and the same request: the value shows on a plain agent's socket, not on a TLS agent's."""
    plain = AgentProc(tmp_path / "plain", name="plain")
    encrypted = AgentProc(tmp_path / "tls", name="tls", secret=tls_credential())
    try:
        seen = {}
        for agent in (plain, encrypted):
            secret = marker()
            port = int(agent.address.rsplit(":", 1)[1])
            with capture_or_require() as cap:
                status, out, _ = agent.run('printf %s "$TLS_MARK" | rev', env={"TLS_MARK": secret})
            assert (status, out.strip()) == (0, secret[::-1].encode())
            flows = cap.flows_of_port(port)
            assert flows, "nothing captured on the agent's port"
            seen[agent.name] = [
                needle in data
                for data in flows.values()
                for needle in (secret, secret[::-1])
                for needle in [needle.encode()]
            ]
        assert any(seen["plain"]), "the capture missed a plain agent's bytes: it would prove nothing"
        assert not any(seen["tls"])
    finally:
        plain.stop()
        encrypted.stop()


@pytest.fixture
def tls_agent(tmp_path):
    a = AgentProc(tmp_path, secret=tls_credential())
    yield a
    a.stop()


def test_tls_client_without_the_job_certificate_runs_nothing(tmp_path, tls_agent):
    pwned = tmp_path / "pwned"
    touch = f"touch {pwned}"
    assert tls_agent.run("echo ok")[:2] == (0, b"ok\n")  # the job's own credential works
    # 1. The MAC secret alone, in clear: the agent waits for TLS and closes.
    with pytest.raises(agent_client.AgentError):
        agent_client.run_capture(tls_agent.address, SECRET, touch, timeout=10, connect_timeout=5)
    # 2. The right MAC secret with another job's certificate: the client refuses the agent (its
    #    certificate is not the pinned one) before it sends anything.
    with pytest.raises(agent_client.AgentError, match="TLS"):
        agent_client.run_capture(tls_agent.address, tls_credential(), touch, timeout=10, connect_timeout=5)
    # 3. Anyone can finish a TLS handshake with the agent (it asks for no client certificate),
    #    but not the protocol's challenge-response inside it without the MAC secret.
    host, port = P.parse_address(tls_agent.address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with ctx.wrap_socket(socket.create_connection((host, port), timeout=5)) as s:
        nonce = P.parse_server_hello(_recv_exact(s, P.SERVER_HELLO_LEN))
        s.sendall(P.client_hello(b"wrong secret", nonce, P.new_nonce()))
        assert _recv_all(s) == b""  # closed, no proof
    assert not pwned.exists()
    assert "bad credentials" in tls_agent.log()


def test_tls_client_refuses_an_agent_without_the_job_certificate(tmp_path):
    """An impostor agent that knows the MAC secret but holds another certificate, or none, learns no command."""
    credential = tls_credential()
    for impostor_secret in (tls_credential(), SECRET):  # another job's certificate; plain text
        impostor = AgentProc(tmp_path / f"impostor-{len(impostor_secret)}", secret=impostor_secret)
        try:
            with pytest.raises(agent_client.AgentError, match="TLS"):
                agent_client.run_capture(
                    impostor.address, credential, "echo secret-command", timeout=10, connect_timeout=5
                )
            assert "secret-command" not in impostor.log()
        finally:
            impostor.stop()


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


def _recv_all(sock):
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, ssl.SSLError, TimeoutError):
        pass
    return data


def test_tls_agent_refuses_a_credential_that_cannot_serve(tmp_path):
    line = tls_credential()
    mac, cert, _key = line.split(b":")
    with pytest.raises(RuntimeError, match="cannot read the job secret"):
        AgentProc(tmp_path, secret=b":".join((mac, cert, cert)))  # the certificate where its key belongs
    assert isinstance(tls.parse_credential(line), tls.Credential)
