"""When a cluster-side reaper ends a job: the pure rules (no I/O).

While the submitting ``mpilaunch`` is attached it renews a heartbeat in the
cluster (a Kubernetes Lease, a key in skein's key-value store). A reaper
next to the job ends it when that heartbeat has not moved for
``--orphan-timeout`` seconds (mpilaunch was SIGKILLed, its machine died,
its network is gone), or when the job ran past its cluster-side deadline
(``--start-timeout`` + ``--timeout`` + a margin: the host enforces
``--timeout`` itself, the cluster only catches what the host cannot).

The reaper judges staleness by when *it* saw the heartbeat change, on its
own monotonic clock, never by comparing the timestamp written on another
machine with its own clock: skew between the two cannot reap a live job.
"""

from __future__ import annotations

import math
from collections import namedtuple

DEFAULT_ORPHAN_TIMEOUT = 60.0
# Below this a busy API server or a GC pause of the host would reap live jobs.
MIN_ORPHAN_TIMEOUT = 3.0
# The cluster-side deadline comes this long after the host's own --timeout
# would have ended the job, so it only acts when the host could not.
DEADLINE_MARGIN_S = 30.0


# collections' namedtuple, not typing's: the CLI imports this module on every launch
Verdict = namedtuple("Verdict", "end reason", defaults=(None,))


Seen = namedtuple("Seen", "value at")
Seen.__doc__ = "The last heartbeat value the reaper saw, and when (its monotonic clock) it first saw it."


def renew_interval(orphan_timeout: float) -> float:
    """How often the host renews: several renewals fit in one timeout, at most every 5 s."""
    return max(0.5, min(5.0, orphan_timeout / 4.0))


def poll_interval(orphan_timeout: float) -> float:
    """How often the reaper looks: a missed timeout is noticed within a fraction of it."""
    return max(0.5, min(5.0, orphan_timeout / 5.0))


def cluster_deadline_s(start_timeout: float, timeout: float | None) -> int | None:
    """Seconds after creation at which the cluster ends the job itself (None: no --timeout)."""
    if timeout is None:
        return None
    return int(math.ceil(start_timeout + timeout + DEADLINE_MARGIN_S))


def observe(previous: Seen | None, value: str | None, now: float) -> Seen:
    """Fold one reading of the heartbeat into what was seen: a new value is a renewal seen ``now``.

    The first reading counts as fresh: the reaper may start long after the
    last renewal was written, and must give the host a full timeout.
    """
    if previous is None or value != previous.value:
        return Seen(value, now)
    return previous


def judge(seen: Seen, now: float, orphan_timeout: float, deadline: float | None = None) -> Verdict:
    """End the job? ``deadline`` is on the same clock as ``now`` (None: none)."""
    if deadline is not None and now >= deadline:
        return Verdict(
            True, f"the job ran past its cluster-side deadline (--start-timeout + --timeout + {DEADLINE_MARGIN_S:g}s)"
        )
    silent = now - seen.at
    if silent >= orphan_timeout:
        return Verdict(
            True,
            f"no heartbeat from the submitting mpilaunch for {silent:.0f}s "
            f"(--orphan-timeout {orphan_timeout:g}s): it was killed or lost its connection",
        )
    return Verdict(False)
