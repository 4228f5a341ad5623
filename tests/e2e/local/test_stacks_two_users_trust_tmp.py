"""`mpilaunch stacks NAME` on a machine shared with another user: a context they plant is ignored (issue 49).

Two local users share one TMPDIR (mode 1777, as /tmp). root runs a real local
job that hangs on purpose; the unprivileged user (``mpilaunch-user``, made by
scripts/nonroot-user.sh) plants ``$TMPDIR/mpilaunch-<job>-/context.json`` (it
sorts before the real run directory) naming the exec-API transport, a TLS
server of theirs (a listener here, recording whatever reaches it), TLS checks
off, and a root-only file as the bearer token, with an empty owner file.
root's ``mpilaunch stacks <job>``, with and without ``--backend k8s``, must
send nothing to that server, and still show the real job's stacks. The pure
checks are ``tests/unit/test_stacks_trust_tmp.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.helpers import PROGRAMS, REPO, finish, leftover_processes, mpilaunch_env, wait_started
from support.mpi_installs import checked, installs, require
from support.other_user import other_user_alone, shared_sticky_dir

pytestmark = pytest.mark.mpi

HANG = PROGRAMS / "hang.py"
NP, ODD = 3, 2  # one worker: ranks 0-1 wait in MPI_Allreduce, rank 2 sleeps
STUCK_SLEEP = next(i for i, line in enumerate(HANG.read_text().splitlines(), 1) if "STUCK: sleep" in line)

# What the other user runs (Debian's python3: root's venv is out of its reach): the run directory of
# a job that seems to be `name`'s, with the context given, and an empty owner file.
PLANT = """
import json, os, sys
base, name, context = sys.argv[1], sys.argv[2], sys.argv[3]
d = os.path.join(base, f"mpilaunch-{name}-")
os.mkdir(d, 0o700)
with open(os.path.join(d, "context.json"), "w") as f:
    f.write(context)
open(os.path.join(d, ".mpilaunch-owner"), "w").close()
print(os.stat(d).st_uid)
"""


@pytest.fixture
def other_user():
    """The unprivileged user's passwd entry, that user this test's alone (no other test counts its
    processes meanwhile)."""
    if os.geteuid() != 0:
        require("plants a file as another user: run as root")
    with other_user_alone(require) as user:
        yield user


@pytest.fixture
def shared_tmp():
    with shared_sticky_dir("trust-tmp-shared-") as d:
        yield d


class PlantedServer:
    """A TLS server on loopback standing in for the other user's: records every connection and the
    request head sent on it (a bearer token included)."""

    def __init__(self, workdir: Path):
        from mpilaunch.backends.agent_credential import self_signed_certificate
        from mpilaunch.wire.tls import pem

        cert, key = self_signed_certificate()
        (workdir / "planted.crt").write_bytes(pem("CERTIFICATE", cert))
        (workdir / "planted.key").write_bytes(pem("PRIVATE KEY", key))
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(workdir / "planted.crt", workdir / "planted.key")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.seen.append(f"connection from {peer}")
            try:
                conn.settimeout(10)
                with self.tls.wrap_socket(conn, server_side=True) as tls:
                    head = b""
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = tls.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                    self.seen.append(head.decode(errors="replace"))
            except OSError as e:
                self.seen.append(f"(no request: {e})")
            finally:
                conn.close()

    def close(self):
        self.sock.close()


def stacks(name: str, shared: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "stacks", name, "--deadline", "30", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=mpilaunch_env(TMPDIR=str(shared), **env),
        timeout=180,
    )


def test_stacks_trust_tmp_a_context_planted_by_another_user_gets_nothing(other_user, shared_tmp, tmp_path):
    openmpi4 = checked(installs()["openmpi4"])
    name = "trust-tmp-victim"
    token = tmp_path / "root-only-token"  # what the planted context asks to be sent as the bearer token
    token.write_text(f"root-secret-{secrets.token_hex(8)}")
    token.chmod(0o600)
    server = PlantedServer(tmp_path)
    planted_context = {
        "job": name,  # no "backend": the old filter took it for any --backend
        "transport": "mpilaunch.backends.k8s.exec_path.transport",
        "server": f"https://127.0.0.1:{server.port}",
        "insecure": True,
        "token_file": str(token),
        "namespace": "default",
        "workers": {f"{name}-worker-0": {"pod": f"{name}-worker-0"}},
    }
    planted = subprocess.run(
        ["/usr/bin/python3", "-c", PLANT, str(shared_tmp), name, json.dumps(planted_context)],
        user=other_user.pw_uid,
        group=other_user.pw_gid,
        extra_groups=[],
        umask=0o022,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": other_user.pw_dir},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planted.returncode == 0 and planted.stdout.strip() == str(other_user.pw_uid), planted.stderr

    job = subprocess.Popen(
        [
            sys.executable, "-m", "mpilaunch", "--mpirun", openmpi4.mpirun, "--name", name,
            "--np", str(NP), "--slots-per-worker", str(NP), "--timeout", "240",
            "--output-dir", str(tmp_path / "out"), "--", sys.executable, str(HANG), "sleep", str(ODD),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=mpilaunch_env(openmpi4, TMPDIR=str(shared_tmp)),
    )  # fmt: skip
    try:
        wait_started(job, NP, text="ready", timeout=120)
        # --backend k8s: the real job is local, only the planted context names the exec API; with
        # no kubeconfig of the caller's there is no job to reach, and nothing goes anywhere
        as_k8s = stacks(name, shared_tmp, "--backend", "k8s", KUBECONFIG=str(tmp_path / "no-kubeconfig"))
        assert server.seen == [], server.seen
        assert as_k8s.returncode == 2, as_k8s.stdout + as_k8s.stderr
        assert token.read_text() not in as_k8s.stdout + as_k8s.stderr
        # the caller's own job is found, the planted one is not in the way ("2 running jobs are named")
        shown = stacks(name, shared_tmp)
        assert server.seen == [], server.seen
        assert shown.returncode == 0, shown.stderr
        assert f"rank {ODD}: time.sleep <- <module> (hang.py:{STUCK_SLEEP})" in shown.stdout.splitlines(), shown.stdout
        assert job.poll() is None  # the job itself is untouched
    finally:
        server.close()
        job.terminate()
        finish(job, 60)
    assert leftover_processes(name) == []
    assert [p.name for p in shared_tmp.iterdir()] == [f"mpilaunch-{name}-"]  # the planted one, left alone
