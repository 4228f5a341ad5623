"""Real exec agents for the tests (``python -m mpilaunch.agent`` on loopback), and
waiting on what they do: ``tests/e2e/local/test_agent.py``, ``test_agent_security.py``,
``test_shim.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mpilaunch.rsh_agent import agent_client
from support.helpers import REPO

SECRET = b"test-secret-0123456789abcdef"


def tls_credential(mac_secret: str = SECRET.decode()) -> bytes:
    """A job's credential line with TLS (a fresh certificate and key), as backends make them."""
    from mpilaunch.backends.agent_credential import self_signed_certificate
    from mpilaunch.wire.tls import format_credential

    return format_credential(mac_secret, *self_signed_certificate()).encode()


def agent_env():
    """This process's environment, with the repository on PYTHONPATH and no session marker."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("MPILAUNCH_SESSION", None)
    return env


def write_secret(path: Path, secret: bytes = SECRET, mode: int = 0o600) -> Path:
    path.write_bytes(secret + b"\n")
    path.chmod(mode)
    return path


class AgentProc:
    """A real ``mpilaunch agent`` subprocess listening on loopback."""

    def __init__(self, tmp: Path, name: str = "w0", args=(), secret: bytes = SECRET, popen=None):
        tmp.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.secret = secret
        self.secret_file = write_secret(tmp / f"{name}.secret", secret)
        self.address_file = tmp / f"{name}.addr"
        self.log_file = tmp / f"{name}.log"
        argv = [
            sys.executable,
            "-m",
            "mpilaunch.agent",
            "--name",
            name,
            "--listen",
            "127.0.0.1:0",
            "--address-file",
            str(self.address_file),
            "--secret-file",
            str(self.secret_file),
            *args,
        ]
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=agent_env(),
                cwd=REPO,
                start_new_session=True,
                **(popen or {}),
            )
        deadline = time.monotonic() + 15
        while not self.address_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start: {self.log()}")
            time.sleep(0.02)
        self.address = self.address_file.read_text()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def run(self, command, **kwargs):
        kwargs.setdefault("timeout", 30)
        return agent_client.run_capture(self.address, self.secret, command, **kwargs)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def session_processes(session_id: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries this session marker."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("MPILAUNCH_SESSION") == session_id:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def wait_until(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_for_file(path: Path, timeout=10.0) -> str:
    assert wait_until(lambda: path.exists() and path.read_text().strip(), timeout), f"{path} never appeared"
    return path.read_text().strip()
