"""A kept mesh's sidecar is asked to quit at the end of a Job's pod (backends/k8s/mesh.py).

A real HTTP server on this machine's loopback stands in for the mesh's proxy (Istio's and
linkerd's images cannot be fetched here); the real-pod test is in tests/e2e/k8s/test_tenant.py.
"""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from mpilaunch.backends.k8s import mesh
from mpilaunch.core import env_names


@pytest.fixture
def proxy():
    """A stand-in proxy: 200 on POST /quitquitquit, 404 elsewhere; the requests it saw."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.command, self.path))
            self.send_response(200 if self.path == "/quitquitquit" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mesh_quit_reaches_the_proxy_that_listens_and_skips_the_others(proxy, monkeypatch):
    url, seen = proxy
    # an HTTP proxy the image carries must not take the pod's loopback requests
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port()}")
    endpoints = (
        ("istio", f"{url}/quitquitquit"),
        ("linkerd", f"http://127.0.0.1:{closed_port()}/shutdown"),  # no such proxy: refused
        ("other", f"{url}/elsewhere"),  # answered, but not taken
    )
    assert mesh.quit_sidecars(endpoints, timeout=2) == ["istio"]
    assert seen == [("POST", "/quitquitquit"), ("POST", "/elsewhere")]


def test_mesh_quit_only_where_the_job_kept_injection(monkeypatch):
    said = []
    mesh.quit_if_injected(said.append, environ={})
    assert said == []
    monkeypatch.setattr(mesh, "quit_sidecars", lambda: ["istio"])
    mesh.quit_if_injected(said.append, environ={env_names.MESH_SIDECARS: "1"})
    assert said == ["asked the mesh's sidecar to quit (istio)"]
    assert mesh.job_pod_env(True) == [{"name": env_names.MESH_SIDECARS, "value": "1"}] and mesh.job_pod_env(False) == []
