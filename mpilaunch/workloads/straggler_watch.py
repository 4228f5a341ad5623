"""--straggler-report: every rank's stacks sampled at a low rate while the job runs (``hang_watch``'s
collection), tallied by ``hang.stragglers``; the rank the others wait for named at the end."""

from __future__ import annotations

import random

from ..hang import DEFAULT_DEADLINE_S
from .base import RunContext, Workload
from .hang_watch import SamplingWatch, take_stacks


def sampling_gap(interval_s: float, draw: float) -> float:
    """The wait before the next sample: ``interval_s`` on average, anywhere from half of it to one and a
    half (``draw`` in [0, 1)). A fixed period locks onto a training loop's period: a 1.0 s step sampled
    every 0.5 s shows every step at the same two moments, and CI saw the straggler named at its short
    compute call (67% of samples) instead of its long data loading (2026-12-07)."""
    return interval_s * (0.5 + draw)


class StragglerWatch(SamplingWatch):
    def __init__(self, run: RunContext, workload: Workload, interval_s: float | None):
        super().__init__("straggler-watch", bool(interval_s) and workload.mode == "mpirun")
        self.run, self.workload, self.interval_s = run, workload, interval_s
        self.tally = None  # made by the sampling thread: a job without --straggler-report imports no tally

    def _run(self) -> None:
        from ..hang import stragglers

        self.tally = stragglers.Tally()
        while not self._done.wait(sampling_gap(self.interval_s, random.random())):
            # the full deadline, as the stall watch's samples: one cut short on a loaded host finds the
            # workers unreachable, and such a sample shows nobody waiting (seen at a 1 s deadline)
            taken = take_stacks(self.run, self.workload, DEFAULT_DEADLINE_S)
            if self._done.is_set():  # the job ended during the sample: its stacks are of ranks exiting
                return
            if taken is not None:
                stragglers.add_sample(self.tally, taken.stacks)

    def found(self) -> dict | None:
        """report.json's ``stragglers`` (and the line, printed), None when nothing was sampled."""
        if not self.interval_s or self.tally is None or self.tally.samples == 0:
            return None
        from ..hang import stragglers

        found = stragglers.report(self.tally, self.interval_s)
        if found["line"]:
            try:
                print(found["line"], file=self.run.stderr, flush=True)
            except (OSError, ValueError):
                pass
        return found
