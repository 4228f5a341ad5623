"""Tunables and names shared by the agent's modules."""

import signal

from ..core import env_names

SESSION_ENV = env_names.SESSION

WORKER_ENV = env_names.WORKER

# From accept to the client's request (RUN or PING). A real client needs one
# round trip for the handshake and sends its request right after; even a
# burst of 64 shims on this 2-core machine finished in 0.4 s. 3 s leaves
# room for a loaded host and frees a slowloris peer's slots 3x sooner than
# the old 10 s.
HANDSHAKE_TIMEOUT = 3.0

# How long a finished connection may take to read what is still queued for
# it (the last output, EXIT) before it is dropped. Only authenticated
# clients get here, so this stays as generous as it was.
CLOSE_LINGER = 10.0

KILL_GRACE = 1.0  # SIGTERM first, SIGKILL whatever is left this much later

# When the agent itself stops it is usually being killed too (YARN sends
# SIGKILL 250 ms after SIGTERM by default), so it escalates much sooner.
STOP_GRACE = 0.25

# Parent-death signal: a dedicated one, because the kernel also sends it when
# the *thread* that spawned us exits; on receipt we check the pid really died.
PDEATH_SIGNAL = signal.SIGUSR2

SCAN_INTERVAL = 0.5  # re-check lingering/killed sessions at least this often

OUT_HIGH_WATER = 1 << 20  # pause reading a session's pipes above this backlog

OUT_LOW_WATER = 1 << 18

STDIN_HIGH_WATER = 4 << 20  # pause reading the client above this stdin backlog

# Connections that have not authenticated yet: at most this many in all,
# and per peer (an IPv4 address or IPv6 /64). A real peer has one or two at
# a time per agent (one shim per daemon, the launcher's pings); a burst from
# one host above the per-peer limit is answered "busy" and retried by the
# client. So one hostile peer holds at most 32 of the 1024 slots, for at
# most HANDSHAKE_TIMEOUT each, and never locks out other peers.
MAX_PENDING_HANDSHAKES = 1024
MAX_PENDING_PER_PEER = 32

# Handshakes one peer may start: a burst, then a rate (a token bucket per peer key). A handshake
# costs the agent's one thread a TLS signature and key exchange however soon the peer hangs up, so
# the pending limit alone let one peer keep it busy by connecting and hanging up in a loop. A real
# peer starts one or two per agent (a shim per daemon, the launcher's pings), a burst of 128 pings
# from one host gets through in about 2 s (retried as for busy), and the cap is far below what one
# thread handshakes in a second.
PEER_ACCEPT_BURST = 64
PEER_ACCEPTS_PER_SECOND = 32.0

REFUSAL_NOTE_INTERVAL = 10.0  # at most one log line per peer and reason this often

CMD_LOG_CHARS = 160
