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


def mark_worker(times: dict[str, dict[str, float]], worker: str, phase: str, at: float | None = None) -> None:
    """Record ``phase`` of one worker the first time it is reached: report.json's
    ``timings.workers`` (created, scheduled, running, ready: what the backend can see of each)."""
    times.setdefault(worker, {}).setdefault(phase, time.monotonic() if at is None else at)


def since_by_worker(t0: float, times: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each worker's phases as seconds since ``t0``: worker -> {phase: seconds}. Already earliest
    first (``mark_worker`` records each phase once, when first seen): no sort, at 1024 workers."""
    return {worker: {p: round(max(0.0, at - t0), 3) for p, at in seen.items()} for worker, seen in times.items()}


def retire_worker(times: dict[str, dict[str, float]], worker: str, attempt: int) -> None:
    """A lost worker replaced (``--retries``): its phases so far become ``<phase>#<attempt>``, so the
    replacement's own ``created``/``ready`` are recorded beside them rather than lost to the first."""
    seen = times.get(worker)
    if seen:
        times[worker] = {(p if "#" in p else f"{p}#{attempt}"): at for p, at in seen.items()}
