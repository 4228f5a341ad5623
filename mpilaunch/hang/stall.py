"""When a job counts as hung (--stall-timeout): pure, fed with samples by the workload's stall watch.

A job is hung when no rank printed anything for the stall timeout and every
rank's stacks stayed the same over the samples taken meanwhile. Samples are
compared coarsely, function by function without line numbers, so a rank
spinning in one loop (its line changes from one sample to the next) still
counts as staying put, and a rank moving through its program does not.
Samples are taken only once the output has been silent for a third of the
timeout: a job that prints costs nothing.
"""

from __future__ import annotations

from .verdict import PYTHON, RUNNING, STOPPED, UNREACHABLE, RankStack, innermost_function

SAMPLES = 3  # identical samples, a third of the timeout apart, before a verdict


def sample_interval(stall_s: float) -> float:
    return stall_s / SAMPLES


def coarse_signature(stacks) -> tuple:
    """Every rank's state, innermost function and Python functions (no line numbers). The innermost
    function of a Python rank is read from its Python frames alone (the call on its line: time.sleep,
    comm.Allreduce): whether one sample got its native frames (the probe's second round, cut short on
    a loaded host) must not make two samples of a rank that has not moved differ. A rank the sample
    could not read (no frames of a live rank: py-spy failed; its worker did not answer) is None:
    unknown, not moved (``same``)."""

    def one(s: RankStack):
        if s.state == UNREACHABLE or (s.state in (RUNNING, STOPPED) and not s.frames):
            return (s.rank, None)
        python = tuple(f for f in s.frames if f.kind == PYTHON)
        return (s.rank, (s.state, innermost_function(python or s.frames), tuple((f.function, f.file) for f in python)))

    return tuple(one(s) for s in sorted(stacks, key=lambda s: s.rank))


def same(before: tuple | None, now: tuple) -> bool:
    """Two samples show the job in the same place: the same ranks, each where it was, or unknown in
    either (one py-spy that failed on a loaded host must not start the stall clock over). A sample
    with no rank known at all shows nothing."""
    if before is None or len(before) != len(now) or all(entry is None for _, entry in now):
        return False
    return all(r1 == r2 and (a is None or b is None or a == b) for (r1, a), (r2, b) in zip(before, now))


def merged(before: tuple, now: tuple) -> tuple:
    """``now`` with its unknown ranks filled in from ``before``."""
    return tuple((rank, b if b is not None else a) for (rank, a), (_, b) in zip(before, now))


class StallClock:
    """Feed it the time of the last output and each sample; it says when the job is hung."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self.signature: tuple | None = None
        self.samples = 0  # consecutive identical samples taken after the last output
        self.first_sample_at: float | None = None

    def should_sample(self, now: float, last_output: float) -> bool:
        return now - last_output >= sample_interval(self.stall_s)

    def observe(self, now: float, last_output: float, signature: tuple) -> bool:
        """One sample taken at ``now``; True once the job counts as hung."""
        if self.first_sample_at is not None and last_output > self.first_sample_at:
            self.signature, self.samples = None, 0  # output since: start over
        if not same(self.signature, signature):
            self.signature, self.samples, self.first_sample_at = signature, 0, now
        else:
            self.signature = merged(self.signature, signature)
        self.samples += 1
        return self.samples >= SAMPLES and now - last_output >= self.stall_s
