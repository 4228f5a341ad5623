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

Only silence the reaper saw counts: the time between the end of one
successful read and the start of the next. An outage of the API server (a
failed read, or one that hung) is no silence of mpilaunch's, whose renewals
could not land either: the time from the last good read before it to the
first good one after it is not counted, so a live job survives an outage of
any length, and a job whose mpilaunch really died is ended once the silence
seen around the outage adds up to the timeout.
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


Seen = namedtuple("Seen", "value at silent blind", defaults=(0.0, False))
Seen.__doc__ = """What the reaper saw of the heartbeat, on its monotonic clock.

``value``: the last value read; ``at``: when the last successful read of it
ended; ``silent``: seconds, up to ``at``, during which reads saw ``value``
unchanged; ``blind``: a read failed since ``at``, so the time after ``at``
was not seen."""


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


def observe(previous: Seen | None, value: str | None, now: float, asked: float | None = None) -> Seen:
    """Fold one successful read of the heartbeat into what was seen: a new value is a renewal seen ``now``.

    ``now``: when the read returned; ``asked``: when it was sent (default
    ``now``). An unchanged value adds the time from the previous good read's
    end to this one's start, and nothing when a read failed in between
    (``unread``): the API server being down, or hanging on this very read,
    is not mpilaunch being silent.

    The first reading counts as fresh: the reaper may start long after the
    last renewal was written, and must give the host a full timeout.
    """
    if previous is None or value != previous.value:
        return Seen(value, now)
    if previous.blind:
        return Seen(value, now, previous.silent)
    asked = now if asked is None else asked
    return Seen(value, now, previous.silent + max(0.0, asked - previous.at))


def unread(previous: Seen | None) -> Seen | None:
    """Fold one failed read (API server unreachable, an error, a timeout): the time until the next
    successful read is not seen, so it is no silence."""
    return None if previous is None else previous._replace(blind=True)


def silence(seen: Seen, now: float) -> float:
    """Seconds of silence seen by ``now``: what was counted, and the time since the last good read
    unless a read failed since."""
    return seen.silent + (0.0 if seen.blind else max(0.0, now - seen.at))


def judge(seen: Seen, now: float, orphan_timeout: float, deadline: float | None = None) -> Verdict:
    """End the job? ``deadline`` is on the same clock as ``now`` (None: none)."""
    if deadline is not None and now >= deadline:
        return Verdict(
            True, f"the job ran past its cluster-side deadline (--start-timeout + --timeout + {DEADLINE_MARGIN_S:g}s)"
        )
    silent = silence(seen, now)
    if silent >= orphan_timeout:
        return Verdict(
            True,
            f"no heartbeat from the submitting mpilaunch for {silent:.0f}s "
            f"(--orphan-timeout {orphan_timeout:g}s): it was killed or lost its connection",
        )
    return Verdict(False)
