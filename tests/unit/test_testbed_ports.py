"""The testbeds' servers get ports below the kernel's ephemeral range (``testbeds/ports.py``): a port
from ``bind(0)`` could become some client's source port before the server bound it (Kueue's manager
failed so in CI: "bind: address already in use"), and outside Kubernetes' NodePort range, which
kube-router lets through to any local address (an API server there stayed open to a pod behind
default-deny egress)."""

from __future__ import annotations

import socket

from testbeds.ports import NODE_PORTS, ephemeral_low, free_port, free_ports


def test_free_ports_are_distinct_bindable_below_the_ephemeral_range_and_off_node_ports():
    ports = free_ports(200)
    assert len(set(ports)) == 200
    assert all(10000 <= p < ephemeral_low() for p in ports), ports
    assert not [p for p in ports if p in NODE_PORTS], "a testbed server on a NodePort bypasses egress policy"
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds them: the picker closed its own sockets


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    import testbeds.ports

    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        spare = free_port()
        # the random draw offers the held port first: the bind check must pass it over
        monkeypatch.setattr(testbeds.ports.random, "sample", lambda population, k: [taken, spare])
        assert free_ports(1) == [spare]
