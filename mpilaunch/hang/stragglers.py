"""--straggler-report: which rank the others wait for, from stacks sampled while the job runs.

Pure functions over samples of every rank's stacks (``collect``'s RankStacks,
grouped as the hang verdict groups them). In a sample where some ranks wait
inside an MPI call and fewer are outside it, those outside are the ones
being waited for. Over the run, the rank outside most often, far more often
than a typical rank, is the straggler; where it was (its place, as the hang
verdict names it) and what the others waited in are the ones seen most.

A healthy job is sampled too: ranks leave and enter the collective at
slightly different moments, so each rank is seen outside now and then. A
straggler stands out only when its share is at least ``MIN_SHARE`` of the
samples and ``FACTOR`` times the median rank's, seen in at least ``MIN_WAITED`` samples of at
least ``MIN_SAMPLES``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from .verdict import RUNNING, describe_place, group_stacks, in_mpi, mpi_call

#: the share of samples a rank must be waited for in to be named
MIN_SHARE = 0.25
#: ... and how many times the median rank's share that must be
FACTOR = 3.0
#: no verdict from fewer samples, and none for a rank waited for in fewer: the ranks' start-up
#: (one still importing its modules while the others wait in the first collective) is one such
#: stretch, not a pattern (seen: a healthy 3 s job's rank named from 2 of 5 samples)
MIN_SAMPLES = 8
MIN_WAITED = 4


@dataclass
class Tally:
    samples: int = 0  # samples taken (every rank's stacks, or as many as answered)
    waited: int = 0  # samples in which some ranks waited in MPI for fewer others
    outside: Counter = field(default_factory=Counter)  # rank -> samples it was waited for in
    places: dict[int, Counter] = field(default_factory=dict)  # rank -> where it was, counted
    waits: Counter = field(default_factory=Counter)  # the MPI call the others waited in, counted
    workers: dict[int, str] = field(default_factory=dict)
    ranks: set = field(default_factory=set)


def waited_call(group) -> str:
    found = mpi_call(group.stack.frames)
    return found[1] if found else group.function


def add_sample(tally: Tally, stacks) -> None:
    """Count one sample of every rank's stacks."""
    groups = [g for g in group_stacks(stacks) if g.state == RUNNING]
    tally.samples += 1
    for g in groups:
        tally.ranks.update(g.ranks)
    for stack in stacks:
        tally.workers.setdefault(stack.rank, stack.worker)
    inside = [g for g in groups if in_mpi(g)]
    outside = [g for g in groups if not in_mpi(g)]
    n_in, n_out = sum(len(g.ranks) for g in inside), sum(len(g.ranks) for g in outside)
    if not inside or not outside or n_out > n_in:
        return
    tally.waited += 1
    for g in outside:
        for rank in g.ranks:
            tally.outside[rank] += 1
            tally.places.setdefault(rank, Counter())[describe_place(g)] += 1
    for g in inside:
        tally.waits[waited_call(g)] += len(g.ranks)


def shares(tally: Tally) -> dict[int, float]:
    """rank -> the share of all samples it was waited for in."""
    return {
        rank: round(tally.outside[rank] / tally.samples, 3) if tally.samples else 0.0 for rank in sorted(tally.ranks)
    }


def straggler(tally: Tally) -> int | None:
    """The rank the others wait for, or None (too few samples, or nobody stands out)."""
    if tally.samples < MIN_SAMPLES or not tally.outside:
        return None
    by_rank = shares(tally)
    rank, top = max(by_rank.items(), key=lambda kv: (kv[1], -kv[0]))
    typical = statistics.median(by_rank.values())
    if top < MIN_SHARE or top < FACTOR * typical or tally.outside[rank] < MIN_WAITED:
        return None
    return rank


def line(tally: Tally, rank: int) -> str:
    """``mpilaunch: straggler: rank 5 (w-2) spent 41% of samples in load_batch at train.py:12 while
    7 others waited in MPI_Allreduce``"""
    share = tally.outside[rank] / tally.samples
    place = tally.places[rank].most_common(1)[0][0]
    others = len(tally.ranks) - 1
    call = tally.waits.most_common(1)[0][0] if tally.waits else "MPI"
    worker = tally.workers.get(rank, "?")
    return (
        f"mpilaunch: straggler: rank {rank} ({worker}) spent {share:.0%} of samples {place} while "
        f"{others} other{'s' if others != 1 else ''} waited in {call}"
    )


def report(tally: Tally, interval_s: float) -> dict:
    """report.json's ``stragglers``."""
    named = straggler(tally)
    return {
        "interval_s": interval_s,
        "samples": tally.samples,
        "samples_with_waiting": tally.waited,
        "shares": {str(rank): share for rank, share in shares(tally).items()},
        "straggler": named,
        "line": line(tally, named) if named is not None else None,
    }
