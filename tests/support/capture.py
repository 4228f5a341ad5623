"""A packet capture of loopback TCP, in Python (no tcpdump here): an ``AF_PACKET`` socket on ``lo``.

Needs CAP_NET_RAW (root). Each direction of each TCP connection is kept as the
concatenation of its segments' payloads, in arrival order: enough to ask
whether some bytes ever crossed loopback in clear (a retransmission can only
duplicate bytes, never hide them).
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time

ETH_P_ALL = 0x0003
ETH_HEADER = 14
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RCVBUF = 64 << 20
DRAIN_S = 2.0


class LoopbackCapture:
    """``with LoopbackCapture() as cap: ...``; then ``cap.flows``: ``{(src port, dst port): payload bytes}``."""

    def __init__(self):
        self.flows = collections.defaultdict(bytearray)
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        # Every loopback packet of the machine comes here (the testbeds' API servers, etcd, YARN):
        # with the default buffer a loaded run dropped the very packets a test looked for (seen in
        # CI: "the capture missed a plain agent's bytes"). Root may force a large one.
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        except OSError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self._sock.bind(("lo", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def _run(self):
        # Once stopped, what is already queued is still read (a loaded machine's capture lags the
        # test): the block's last packets count too, for up to DRAIN_S (other traffic never stops).
        drain_until = None
        while True:
            if drain_until is None and self._stop.is_set():
                drain_until = time.monotonic() + DRAIN_S
            if drain_until is not None and time.monotonic() > drain_until:
                return
            try:
                packet, addr = self._sock.recvfrom(1 << 17)
            except (socket.timeout, OSError):
                if drain_until is not None:
                    return
                continue
            if addr[2] == socket.PACKET_OUTGOING:  # on lo every packet shows twice: keep the incoming copy
                continue
            self._add(packet[ETH_HEADER:])

    def _add(self, ip: bytes) -> None:
        version = ip[0] >> 4
        if version == 4 and ip[9] == socket.IPPROTO_TCP:
            tcp = ip[(ip[0] & 0x0F) * 4 :]
        elif version == 6 and ip[6] == socket.IPPROTO_TCP:  # no extension headers on loopback TCP
            tcp = ip[40:]
        else:
            return
        src, dst = struct.unpack("!HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            self.flows[(src, dst)] += payload

    def flows_of_port(self, port: int) -> dict:
        return {k: bytes(v) for k, v in self.flows.items() if port in k}

    def contains(self, needle: bytes) -> list:
        """The flows in which ``needle`` appears."""
        return [k for k, v in self.flows.items() if needle in v]


def capture_or_require():
    """A LoopbackCapture, or ``require`` (skip, or fail in CI) where this process may not capture."""
    from support.mpi_installs import require

    try:
        return LoopbackCapture()
    except PermissionError:
        require("capturing loopback packets needs CAP_NET_RAW (run as root)")
