"""A minimal DNS A-record query (stdlib only), to ask the cluster's DNS itself.

The launcher pod needs to know when *other* pods can resolve its name: its
own resolver answers from /etc/hosts (the kubelet writes the pod's name
there), so only a query to the nameserver tells what the workers will see.
"""

from __future__ import annotations

import os
import socket
import struct


def nameserver(resolv_conf: str = "/etc/resolv.conf") -> str | None:
    """The first ``nameserver`` of resolv.conf, None when there is none."""
    try:
        with open(resolv_conf) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1]
    except OSError:
        return None
    return None


def query_a(server: str, name: str, timeout: float = 2.0) -> list[str]:
    """The A records of the fully qualified ``name`` from ``server``:53 (empty: none yet)."""
    qid = os.getpid() & 0xFFFF
    question = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    question += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    question += struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(question, (server, 53))
        data, _ = s.recvfrom(4096)
    answers = struct.unpack(">H", data[6:8])[0]
    i = len(question)
    out = []
    for _ in range(answers):
        while data[i] and data[i] < 0xC0:  # a name: labels, ended by 0 or a pointer
            i += data[i] + 1
        i += 2 if data[i] >= 0xC0 else 1
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[i : i + 10])
        i += 10
        if rtype == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(data[i : i + rdlen]))
        i += rdlen
    return out
