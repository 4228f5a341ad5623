"""Who may start a handshake, and how refusals are logged.

Agents listen on every address (YARN containers on ``0.0.0.0``), so anyone
who can reach the port can open connections that never authenticate.  Each
one costs a slot until the handshake deadline; this module bounds what one
peer can hold, so a slowloris on one host cannot starve the launcher's shims
and pings from another.  Only unauthenticated connections count: an
authenticated client proved it holds the job secret.
"""

import socket


def peer_key(host: str) -> str:
    """The unit a per-peer limit applies to: an IPv4 address, or an IPv6 /64.

    One IPv6 host usually owns a whole /64, so counting single addresses
    would let it open a fresh slot from each; an IPv4-mapped address
    (a dual-stack listener) counts as the IPv4 address it is.
    """
    try:
        packed = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
    except (OSError, ValueError):
        return host  # IPv4, or a non-IP peer (a Unix socket in tests)
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed[:8] + b"\0" * 8) + "/64"


class PendingLimits:
    """Counts unauthenticated connections per peer and in all; says who is refused."""

    def __init__(self, per_peer: int, total: int):
        self.per_peer = per_peer
        self.total = total
        self.by_peer = {}  # peer key -> unauthenticated connections held
        self.count = 0

    def admit(self, key: str):
        """Count one more pending connection from ``key``; None, or why it is refused."""
        if self.by_peer.get(key, 0) >= self.per_peer:
            return f"too many connections waiting to authenticate from this peer (limit {self.per_peer})"
        if self.count >= self.total:
            return f"too many connections waiting to authenticate (limit {self.total})"
        self.by_peer[key] = self.by_peer.get(key, 0) + 1
        self.count += 1
        return None

    def release(self, key: str) -> None:
        """One connection from ``key`` authenticated or closed."""
        left = self.by_peer.get(key, 0) - 1
        if left > 0:
            self.by_peer[key] = left
        else:
            self.by_peer.pop(key, None)
        self.count = max(0, self.count - 1)


class AcceptRate:
    """A token bucket per peer: how many handshakes a peer may start, in a burst and per second.

    The pending limit bounds what a peer holds at once, not how fast it
    churns: a peer that sends a TLS hello and hangs up at once is released
    as fast as it connects, and each connection costs the agent's one
    thread a TLS handshake (a signature and a key exchange). Past its
    bucket a peer is answered busy, in clear, before any TLS: a real client
    backs off and retries, as for the pending limit.
    """

    def __init__(self, per_second: float, burst: int):
        self.per_second = per_second
        self.burst = burst
        self.buckets = {}  # peer key -> (tokens, monotonic time of that count)

    def take(self, key: str, now: float) -> bool:
        """One token from ``key``'s bucket: False when it has none left."""
        tokens, then = self.buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.per_second)
        if tokens < 1.0:
            self.buckets[key] = (tokens, now)
            return False
        if len(self.buckets) > 4096:  # many peers over time: forget those whose bucket is full again
            full_after = self.burst / self.per_second
            self.buckets = {k: v for k, v in self.buckets.items() if now - v[1] < full_after}
        self.buckets[key] = (tokens - 1.0, now)
        return True


def peer_credentials(sock) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a Unix socket, as it connected (SO_PEERCRED;
    the uid as this process's user namespace sees it, as ``os.geteuid()`` does)."""
    import struct

    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


class QuietNotes:
    """Log lines about unauthenticated peers, at most one per (peer, reason) per interval.

    A hostile peer can cause thousands of refusals a second; each would
    otherwise be a log line (the agent's log is the container's, on disk).
    The next line that gets through says how many were held back.
    """

    def __init__(self, interval: float):
        self.interval = interval
        self.quiet_until = {}  # (peer key, reason) -> monotonic time
        self.held_back = {}  # (peer key, reason) -> lines not written since

    def note(self, key: str, reason: str, text: str, now: float):
        """``text`` to log now (with a count of the lines held back), or None to stay quiet."""
        slot = (key, reason)
        if now < self.quiet_until.get(slot, 0.0):
            self.held_back[slot] = self.held_back.get(slot, 0) + 1
            return None
        if len(self.quiet_until) > 4096:  # many peers over time: forget the old ones
            self.quiet_until = {k: t for k, t in self.quiet_until.items() if t > now}
            self.held_back = {k: n for k, n in self.held_back.items() if k in self.quiet_until}
        self.quiet_until[slot] = now + self.interval
        held = self.held_back.pop(slot, 0)
        return text + (f" ({held} more like it since the last note)" if held else "")
