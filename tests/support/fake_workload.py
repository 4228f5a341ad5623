"""A scripted fake workload for the lifecycle harness (tests/lifecycle): no mpirun, no ranks.

``FakeWorkload`` implements ``mpilaunch.workloads.base.Workload`` and plays one
*outcome* per attempt (one per ``watch`` call). An outcome decides the attempt
the way the mpirun workload does, through the same pure code
(``workloads/mpirun_outcome.py``, ``placement.py``), so exit codes and failure
texts have the real shape:

    succeeds()                         every rank exits 0 (unreported=(2, 3): their lines never came)
    rank_fails(2, code=1)              rank 2's wrapper reports exit 1
    misplaced(3)                       rank 3 starts on the launcher: EXIT_PLACEMENT
    times_out()                        runs until the watch's deadline: EXIT_TIMEOUT
    loses("job-worker-1", "Evicted")   the worker disappears; the lost-worker watch stops the run
    loses(..., noticed="mpirun")       ... mpirun fails first (exit 255); the lifecycle asks once more
    runs_until_stopped()               runs until someone calls stop()
    raises(exc) / sends(signal.SIGTERM)

Every hook call goes into the ``CallLog`` shared with ``support.fake_backend``.
"""

from __future__ import annotations

import json
import threading
import time

from mpilaunch.core import placement
from mpilaunch.core.exit_codes import EXIT_PLACEMENT, EXIT_TIMEOUT
from mpilaunch.core.rank_lines import NO_WORKER
from mpilaunch.core.result import number_ranges, timeout_failure
from mpilaunch.runtime.output import RankOutput
from mpilaunch.workloads.base import Workload
from mpilaunch.workloads.mpirun_outcome import decide_outcome, failure_message, rank_statuses
from support.fake_backend import CallLog, Script, perform

STOP_WAIT_S = 10.0  # an outcome waiting for stop() gives up after this (the test then fails on the code)
NEVER_STOPPED = 99
STOPPED = "mpirun was stopped by mpilaunch"  # the mpirun workload's words


def _ended(wl: "FakeWorkload", statuses, mpirun_code: int):
    """mpirun ended by itself with these rank status lines: the mpirun workload's verdict."""
    wl.output.statuses = list(statuses)
    wl.mpirun_code = mpirun_code
    code, failure = decide_outcome(mpirun_code, wl.output)
    return code, (failure_message(failure, wl.output, mpirun_code) if code != 0 else None)


def _wait_for_stop(wl: "FakeWorkload"):
    if not wl.stopped.wait(STOP_WAIT_S):
        return NEVER_STOPPED, "fake workload: nobody stopped it"
    wl.mpirun_code = 143
    why = f"{STOPPED} {wl.stop_reason or 'before it ended'}"
    return 143, failure_message(None, wl.output, 143, stopped=why)


def succeeds(unreported=()):
    """mpirun exits 0; the ranks in ``unreported`` never sent their status line (Open MPI 5 can
    exit 0 after losing a daemon with its ranks)."""

    def outcome(wl, run, deadline):
        workers = wl.plan.rank_to_worker()
        return _ended(wl, [(r, w, 0) for r, w in enumerate(workers) if r not in unreported], 0)

    return outcome


def rank_fails(rank: int, code: int = 1):
    def outcome(wl, run, deadline):
        workers = wl.plan.rank_to_worker()
        return _ended(wl, [(rank, workers[rank], code)], code)

    return outcome


def misplaced(rank: int):
    """Rank ``rank`` starts outside every worker (mpirun forked it itself): the fail-fast check's verdict."""

    def outcome(wl, run, deadline):
        workers = wl.plan.rank_to_worker()
        wl.output.starts = [
            (r, None, wl.plan.ranks, NO_WORKER if r == rank else workers[r], "launcher-host")
            for r in range(wl.plan.ranks)
        ]
        starts = [placement.RankStart.from_tuple(t) for t in wl.output.starts]
        mismatch = placement.check(wl.plan, starts, complete=False)
        hint = placement.likely_cause(mismatch, flavour="openmpi", major=5)
        return EXIT_PLACEMENT, f"{mismatch.message}\n  hint: {hint}"

    return outcome


def times_out():
    def outcome(wl, run, deadline):
        assert deadline is not None, "the lifecycle gave no deadline for --timeout"
        time.sleep(max(0.0, deadline - time.monotonic()))
        return EXIT_TIMEOUT, timeout_failure(wl.spec.timeout)

    return outcome


def loses(worker: str, reason: str, noticed: str = "watch"):
    """The worker disappears. ``noticed="watch"``: the run goes on until the lifecycle stops it;
    ``"mpirun"``: mpirun fails at once (exit 255), before the watch has asked."""

    def outcome(wl, run, deadline):
        run.backend.lose(worker, reason, settle_only=noticed != "watch")
        if noticed == "watch":
            return _wait_for_stop(wl)
        wl.mpirun_code = 255
        return 255, failure_message(None, wl.output, 255)

    return outcome


def runs_until_stopped():
    return lambda wl, run, deadline: _wait_for_stop(wl)


def raises(exc: BaseException):
    def outcome(wl, run, deadline):
        raise exc

    return outcome


def sends(signum):
    """A real signal to this process while the workload runs (the lifecycle's handler raises)."""

    def outcome(wl, run, deadline):
        perform(signum)
        return NEVER_STOPPED, "fake workload: the signal did not interrupt the run"

    return outcome


class FakeWorkload(Workload):
    mode = "fake"

    def __init__(self, spec, plan, outcomes, *, log: CallLog | None = None, script: Script | None = None):
        super().__init__(spec, plan.job_name, plan)
        self.outcomes = list(outcomes)
        self.log = log if log is not None else CallLog()
        self.script = script or Script()
        self.attempt = 1
        self.output: RankOutput | None = None
        self.mpirun_code: int | None = None
        self.stop_reason: str | None = None
        self.stopped = threading.Event()
        self.contexts: list[dict] = []  # the shim's context file as each start found it

    def _hook(self, hook: str, *args):
        self.log.add(hook, *args)
        return self.script.act(hook)

    def print_dry_run(self, backend, environ, stream) -> None:
        raise AssertionError("run_job never prints a dry run")

    def waiting_for(self) -> str:
        return f"waiting for {len(self.plan.workers)} workers"

    def start(self, run) -> None:
        self._hook("start", self.attempt)
        self.contexts.append(json.loads(run.context_file.read_text()))
        self.output = RankOutput(None, None)
        self.stopped.clear()
        self.stop_reason = None

    def watch(self, run, deadline):
        self._hook("watch", deadline)
        assert self.outcomes, f"no outcome scripted for attempt {self.attempt}"
        return self.outcomes.pop(0)(self, run, deadline)

    def note_stop(self, why: str, broken: bool = False) -> None:
        self.log.add("note_stop", why)
        self.stop_reason = why

    def stop(self) -> None:
        self.stopped.set()
        self._hook("stop")

    def close(self) -> None:
        self._hook("close")

    def reset(self, attempt: int) -> None:
        self._hook("reset", attempt)
        self.attempt = attempt
        self.output = self.mpirun_code = None

    def collect(self, run) -> None:
        self._hook("collect")
        run.result.ranks = rank_statuses(self.plan, self.output or RankOutput(None, None), self.mpirun_code)

    def report(self, run, workers: dict) -> dict:
        self._hook("report")
        return {
            "job": self.job_name,
            "exit_code": run.result.exit_code,
            "failure": run.result.failure,
            "workers": workers,
            "ranks": [r.__dict__ for r in run.result.ranks],
        }

    def units_on(self, worker: str) -> str | None:
        ranks = [r for r, w in enumerate(self.plan.rank_to_worker()) if w == worker]
        return f"rank{'s' if len(ranks) > 1 else ''} {number_ranges(ranks)}" if ranks else None

    def all_units_reported(self) -> bool:
        return self.output is not None and {r for r, _, _ in self.output.statuses} >= set(range(self.plan.ranks))
