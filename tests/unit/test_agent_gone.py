"""A worker whose agent is gone is lost at once; a slow one is not (``agent_client.gone``,
``yarn/report.container_loss``).

On YARN the container of a dead agent is reported ended 2-3 s after it died; a refused
connection to the agent's address says so at once, while a connection that merely waits
(a loaded host) says nothing. Real sockets on loopback."""

from __future__ import annotations

import socket

from mpilaunch.backends.agent_workers import gone_agents
from mpilaunch.backends.yarn.report import container_loss
from mpilaunch.rsh_agent.agent_client import gone


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on leaving: nothing listens there now


def test_nothing_listening_is_gone_and_a_listener_is_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        alive = f"127.0.0.1:{listener.getsockname()[1]}"
        dead = f"127.0.0.1:{closed_port()}"
        assert gone(dead) and not gone(alive)
        assert gone_agents({"w0": alive, "w1": dead}) == {"w1"}


def test_a_connection_that_only_waits_is_not_gone():
    # a listener whose backlog is full drops further SYNs (Linux's default): a connect times out
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        held = []
        try:
            for _ in range(4):  # fill the backlog: the connects past it time out
                s = socket.socket()
                s.settimeout(0.2)
                held.append(s)
                try:
                    s.connect(("127.0.0.1", port))
                except TimeoutError:
                    break
            else:
                raise AssertionError("the backlog never filled: no waiting connection to test")
            assert not gone(f"127.0.0.1:{port}", timeout=0.3)
        finally:
            for s in held:
                s.close()


def test_a_gone_agent_s_worker_is_lost_with_yarn_s_word_first():
    running = {"state": "RUNNING"}
    assert container_loss(running, silent=False) is None
    assert container_loss(running, silent=True) == "agent connection lost (its container is still RUNNING)"
    assert (
        container_loss(running, silent=True, gone=True) == "its agent is gone (nothing listens at its address any more)"
    )
    ended = {"state": "FAILED", "exit": "Container failed during execution"}
    assert container_loss(ended, silent=True, gone=True) == "container failed: Container failed during execution"
