"""What the ssh backend runs on a host (backends/ssh/remote.py), here without ssh: its input through a pipe.

The contract every cleanup on a host rests on: when the session's stdin
ends, the agent ends, with everything it started, and the host keeps
nothing (its unpacked mpilaunch and the agent's private directory go too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import psutil

from support.helpers import wait_for


def test_the_agent_ends_with_its_stdin_and_so_does_what_it_ran(tmp_path):
    from mpilaunch.backends.ssh.backend import READY, STAGE0, session_input
    from mpilaunch.rsh_agent import agent_client

    secret = os.urandom(32).hex().encode()
    env = dict(os.environ, SSH_CONNECTION="127.0.0.1 40000 127.0.0.1 22", TMPDIR=str(tmp_path))
    host = subprocess.Popen(
        [sys.executable, "-c", STAGE0, "node-x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        host.stdin.write(session_input(secret))
        host.stdin.flush()
        line = host.stdout.readline()
        assert line.startswith(READY)
        facts = json.loads(line[len(READY) :])
        assert facts["address"].startswith("127.0.0.1:") and facts["pid"] == host.pid
        assert secret.decode() not in " ".join(psutil.Process(host.pid).cmdline())
        # a session that runs until it is killed, started through the agent as mpirun's shim starts one
        ended = []

        def run_session():
            with open(os.devnull, "wb") as null:
                try:
                    ended.append(
                        agent_client.run_command(
                            facts["address"], secret, "exec sleep 300", stdout=null.fileno(), stderr=null.fileno()
                        )
                    )
                except agent_client.AgentError as e:
                    ended.append(str(e))

        session = threading.Thread(target=run_session, daemon=True)
        session.start()
        sleeper = wait_for(
            lambda: [p for p in psutil.Process(host.pid).children(recursive=True) if p.name() == "sleep"],
            20,
            "the session's sleep",
        )[0]
        assert {d.split("-")[1] for d in os.listdir(tmp_path)} == {"ssh", "node"}  # the zip's, the agent's
        host.stdin.close()  # the ssh session ended
        assert host.wait(timeout=10) == 0
        session.join(timeout=10)
    finally:
        host.kill()
    assert ended == [f"lost connection to agent at {facts['address']}"]  # the shim's view: mpirun's daemon is gone
    stderr = host.stderr.read().decode()
    assert "stopping: stdin closed: the session that started this agent ended" in stderr, stderr
    assert not psutil.pid_exists(sleeper.pid) or sleeper.status() == psutil.STATUS_ZOMBIE
    assert os.listdir(tmp_path) == []
