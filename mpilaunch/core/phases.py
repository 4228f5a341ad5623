"""When each phase of a launch was reached: report.json's ``timings.phases``.

Every part of a job records the moments it sees (``mark``) in a plain dict of
``time.monotonic()`` values: the lifecycle (allocated, workers ready, ...),
the backend (``backend.phase_times``: on Kubernetes pods scheduled,
containers running, ...) and the workload (mpirun started, first rank
output, ...). The lifecycle merges them into one table of seconds since
mpilaunch started, in the order they happened (``since``).

A phase is the moment *mpilaunch saw* it (a poll, a line arriving), never a
remote clock's timestamp: every number comes from one clock, so the table is
ordered and needs no clock-skew caveat; a polled phase is late by at most
one poll interval.
"""

from __future__ import annotations

import time


def mark(times: dict[str, float], phase: str, at: float | None = None) -> None:
    """Record ``phase`` the first time it is reached (later calls keep the first)."""
    times.setdefault(phase, time.monotonic() if at is None else at)


def since(t0: float, *sources: dict[str, float]) -> dict[str, float]:
    """Seconds since ``t0`` of every phase of every source, earliest first
    (a phase in several sources keeps its earliest moment)."""
    merged: dict[str, float] = {}
    for times in sources:
        for phase, at in times.items():
            if phase not in merged or at < merged[phase]:
                merged[phase] = at
    return {p: round(max(0.0, at - t0), 3) for p, at in sorted(merged.items(), key=lambda kv: kv[1])}
