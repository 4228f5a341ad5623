"""Ports for the testbeds' servers (stdlib only).

A port from ``bind(0)`` is an ephemeral one: between picking it and the
server binding it, any process's outgoing connection may take it as its
source port ("Address already in use"). Seen under load: YARN's daemons
(the NodeManagers retry the ResourceManager every 200 ms), and Kueue's
manager in CI with the suite's four parts side by side. Ports under the
kernel's ephemeral range are never handed out that way.

Nor Kubernetes' NodePort range (30000-32767, the API server's default):
a NetworkPolicy enforcer lets any traffic to a local address on those
ports through ("allow LOCAL TCP traffic to node ports", kube-router), so an
API server listening there stays open to a pod behind default-deny egress
(the testbed's egress test failed so in CI with port 3xxxx).
"""

from __future__ import annotations

import random
import socket

#: Kubernetes' default --service-node-port-range, kept free of testbed servers
NODE_PORTS = range(30000, 32768)
LOWEST = 10000


def ephemeral_low(default: int = 32768) -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1 that nothing had bound, below the ephemeral range
    and the NodePort range (chosen at random, so that testbeds starting side by side rarely pick the same);
    ephemeral ones only when too few are free there."""
    high = max(LOWEST + 1 + n, min(ephemeral_low(), NODE_PORTS.start))
    socks = []
    try:
        candidates = random.sample(range(LOWEST, high), min(4000, high - LOWEST))
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # fall back to ephemeral ports
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
