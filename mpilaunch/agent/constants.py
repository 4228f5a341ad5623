"""Tunables and names shared by the agent's modules."""

import signal

SESSION_ENV = "MPILAUNCH_SESSION"

WORKER_ENV = "MPILAUNCH_WORKER"

HANDSHAKE_TIMEOUT = 10.0

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

MAX_PENDING_HANDSHAKES = 1024

CMD_LOG_CHARS = 160

