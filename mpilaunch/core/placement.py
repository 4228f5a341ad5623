"""Placement verification: where the ranks really started, against the plan.

Every rank wrapper prints a start line (rank, local rank, size, worker,
host) before it runs the program. :func:`check` compares those with the
plan: each worker runs exactly its slots, the ranks number 0..np-1 in a
world of size np, and none runs outside a worker (a rank that mpirun forked
next to itself carries no worker name: the classic failure of exec-based
launchers, which otherwise "succeeds"). :func:`likely_cause` turns a
mismatch into a hint naming what the detected MPI reads. Pure functions;
``workloads/verification.py`` feeds them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from . import mpi
from .rank_lines import NO_WORKER
from .spec import Plan

LAUNCHER_KEY = "(launcher)"  # report.json's name for ranks outside every worker

# kinds of mismatch, for hints and report.json
LAUNCHER = "on-launcher"
FOREIGN = "foreign-worker"
SIZE = "size"
DUPLICATE = "duplicate-rank"
OVERFULL = "over-slots"
LOCAL_RANK = "local-rank"
MISSING = "missing"


@dataclass(frozen=True)
class RankStart:
    """Where one rank said it started (its wrapper's start line)."""

    rank: int
    local_rank: int | None
    size: int | None
    worker: str  # NO_WORKER: started outside every worker
    host: str

    @classmethod
    def from_tuple(cls, t) -> "RankStart":
        return cls(*t)


@dataclass(frozen=True)
class Mismatch:
    """One way the ranks' placement differs from the plan."""

    kind: str
    message: str


def ranges(numbers) -> str:
    """[0, 1, 2, 5] -> '0-2, 5' (rank lists stay one line at any scale)."""
    nums = sorted(set(numbers))
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def check(
    plan: Plan, starts: list[RankStart], *, complete: bool, finished: dict[int, str] | None = None
) -> Mismatch | None:
    """The first way the started ranks differ from the plan, or None.

    Without ``complete`` only what more ranks cannot fix is reported (a rank
    outside the workers, a wrong world size, a worker over its slots), so the
    launcher can fail as soon as it sees one. With ``complete`` (mpirun ended
    well) missing ranks count too; ``finished`` (rank -> worker from the exit
    status lines) stands in for a start line that got lost.
    """
    slots = {w.name: w.slots for w in plan.workers}
    np = plan.ranks  # a property summing the slots: not inside the loops below
    where = f"(plan: {_plural(np, 'rank')} on {_plural(len(plan.workers), 'worker')})"
    outside = [s.rank for s in starts if s.worker == NO_WORKER]
    if outside:
        return Mismatch(
            LAUNCHER,
            f"placement check failed: {'rank' if len(outside) == 1 else 'ranks'} "
            f"{ranges(outside)} started on the launcher, not in a worker {where}",
        )
    foreign = sorted({s.worker for s in starts if s.worker not in slots})
    if foreign:
        ranks = [s.rank for s in starts if s.worker in foreign]
        return Mismatch(
            FOREIGN,
            f"placement check failed: ranks {ranges(ranks)} started in "
            f"{', '.join(foreign[:3])}, not a worker of job {plan.job_name} {where}",
        )
    sizes = sorted({s.size for s in starts if s.size is not None and s.size != np})
    if sizes:
        return Mismatch(
            SIZE,
            f"placement check failed: ranks report an MPI world of size "
            f"{', '.join(map(str, sizes))}, the plan has {np} ranks {where}",
        )
    beyond = sorted({s.rank for s in starts if s.rank >= np})
    if beyond:
        return Mismatch(
            SIZE, f"placement check failed: rank {ranges(beyond)} started, the plan has ranks 0-{np - 1} {where}"
        )
    counts = Counter(s.rank for s in starts)
    twice = [r for r, n in counts.items() if n > 1]
    if twice:
        return Mismatch(DUPLICATE, f"placement check failed: rank {ranges(twice)} started more than once {where}")
    per_worker = Counter(s.worker for s in starts)
    over = [(w, n) for w, n in per_worker.items() if n > slots[w]]
    if over:
        w, n = over[0]
        return Mismatch(
            OVERFULL,
            f"placement check failed: worker {w} runs {n} ranks "
            f"({ranges(s.rank for s in starts if s.worker == w)}), its plan has "
            f"{_plural(slots[w], 'slot')} {where}",
        )
    bad_local = [s for s in starts if s.local_rank is not None and s.local_rank >= slots[s.worker]]
    if bad_local:
        s = bad_local[0]
        return Mismatch(
            LOCAL_RANK,
            f"placement check failed: rank {s.rank} on worker {s.worker} has local rank "
            f"{s.local_rank}, the worker has {_plural(slots[s.worker], 'slot')}: MPI sees "
            f"several workers as one host {where}",
        )
    if not complete:
        return None
    seen = {s.rank: s.worker for s in starts}
    for rank, worker in (finished or {}).items():
        seen.setdefault(rank, worker)
    missing = [r for r in range(np) if r not in seen]
    if missing:
        return Mismatch(
            MISSING,
            f"placement check failed: only {len(seen)} of {np} ranks started (missing: {ranges(missing)}) {where}",
        )
    per_worker = Counter(seen.values())
    short = [w.name for w in plan.workers if per_worker.get(w.name, 0) != w.slots]
    if short:
        w = short[0]
        return Mismatch(
            OVERFULL,
            f"placement check failed: worker {w} ran {per_worker.get(w, 0)} ranks, "
            f"its plan has {_plural(slots[w], 'slot')} {where}",
        )
    return None


def agent_setting(flavour: str, major: int) -> str:
    """What this flavour reads to reach the workers through the shim; named in hints."""
    strategy = mpi.FLAVOURS.get(flavour)
    return strategy.agent_setting(major) if strategy else f"{flavour} takes the agent from its own option"


def likely_cause(
    mismatch: Mismatch, *, flavour: str, major: int, local_hosts: tuple[str, ...] = (), mpi_args: tuple[str, ...] = ()
) -> str:
    """The hint line: the most likely reason for this mismatch with this MPI."""
    args = f"; check --mpi-args {' '.join(mpi_args)!r}" if mpi_args else ""
    if mismatch.kind == LAUNCHER:
        if local_hosts:
            return (
                f"host name {', '.join(local_hosts[:3])} resolves to this machine, so mpirun started those "
                f"ranks itself instead of through mpilaunch-rsh: name workers with names that do not resolve "
                f"here (the default <job>-worker-<i>)"
            )
        return (
            f"mpirun did not use mpilaunch-rsh for every host: {agent_setting(flavour, major)}; an agent, host "
            f"list or hostfile set another way (mca-params file, environment, wrapper script) "
            f"overrides mpilaunch's{args}"
        )
    if mismatch.kind == FOREIGN:
        return (
            "the ranks ran in another job's workers: is mpilaunch itself running inside a worker whose agent answers?"
        )
    if mismatch.kind in (SIZE, MISSING):
        return f"mpirun started another number of ranks than --np/--gpus asked: an -np/-n in --mpi-args or a wrapper around mpirun{args or ''}"
    if mismatch.kind == LOCAL_RANK:
        return "the workers' host names collide for MPI (same hostname); give each worker its own host name"
    return (
        f"mpirun mapped ranks differently from the hostfile's slots: a mapping option (--map-by, -ppn, "
        f"--host) overrides it{args}"
    )


def summary(
    plan: Plan, starts: list[RankStart], mismatch: Mismatch | None, enabled: bool, note: str | None = None
) -> dict:
    """The verified placement for report.json; ``verified`` is None when no check ran (``note`` says why)."""
    by_worker: dict[str, list[int]] = {w.name: [] for w in plan.workers}
    for s in sorted(starts, key=lambda s: s.rank):
        by_worker.setdefault(LAUNCHER_KEY if s.worker == NO_WORKER else s.worker, []).append(s.rank)
    return {
        "verified": (mismatch is None) if enabled else None,
        "mismatch": None if mismatch is None else {"kind": mismatch.kind, "message": mismatch.message},
        "note": note,
        "workers": {
            name: {"planned_slots": next((w.slots for w in plan.workers if w.name == name), 0), "ranks": ranks}
            for name, ranks in by_worker.items()
        },
        "ranks": [
            {"rank": s.rank, "local_rank": s.local_rank, "size": s.size, "worker": s.worker, "host": s.host}
            for s in sorted(starts, key=lambda s: s.rank)
        ],
    }
