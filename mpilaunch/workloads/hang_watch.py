"""The hang diagnosis of a running mpirun job: once at --timeout, and the --stall-timeout watch.

Both take every rank's stacks through the workers' exec channel (``hang.collect``:
the transport the backend's context names, its agents or the Kubernetes exec
API), print the ``mpilaunch: hang:`` line on stderr and keep what report.json
gets (``stacks``, ``hang``). Only an mpirun job has rank wrappers to find.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from ..backends.cluster_notes import post_hang
from ..hang import DEFAULT_DEADLINE_S
from .base import RunContext, Workload

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of every launch)
if TYPE_CHECKING:
    from ..hang import collect, verdict

# --timeout: the diagnosis before the stop is bounded (issue 42: at most 15 s at 64 ranks)
TIMEOUT_DIAGNOSIS_S = DEFAULT_DEADLINE_S


def probe_python(backend) -> str:
    """How a worker runs the probe: this interpreter where the workers are on this host."""
    if backend.workers_on_this_host:
        return sys.executable
    from ..backends.rendezvous import rank_python

    return rank_python(backend.rank_prefix())


def take_stacks(run: RunContext, workload: Workload, deadline_s: float) -> collect.Collection | None:
    """Every rank's stacks, or None where they cannot be had (a PS job, no agents to ask)."""
    if workload.mode != "mpirun":
        return None
    try:
        # the context the shims use (lifecycle.write_context); asking the backend again is not free:
        # a Kubernetes job's exec_context starts a fresh exec relay, under the running shims
        context = json.loads(run.context_file.read_text())
    except (OSError, ValueError):
        return None
    if not context.get("workers"):
        return None
    from ..hang import collect  # a job that never takes stacks never imports the probe's side

    output = getattr(workload, "output", None)
    exits = {rank: code for rank, _, code in (output.statuses if output is not None else ())}
    expected = dict(enumerate(workload.plan.rank_to_worker()))
    try:
        return collect.collect_from_context(
            context, probe_python(run.backend), expected=expected, exits=exits, deadline_s=deadline_s
        )
    except (OSError, ValueError) as e:  # the secret unreadable: no diagnosis, the job's end stands
        print(f"mpilaunch: warning: no stacks taken: {e}", file=run.stderr, flush=True)
        return None


def diagnose(run: RunContext, workload: Workload, deadline_s: float = TIMEOUT_DIAGNOSIS_S) -> dict | None:
    """Take the stacks, print the verdict line; report.json's ``hang`` and ``stacks`` (None: none taken)."""
    from ..hang import verdict

    taken = take_stacks(run, workload, deadline_s)
    if taken is None:
        return None
    return publish(run, verdict.diagnose(taken.stacks), taken.seconds)


def publish(run: RunContext, diagnosis: verdict.Diagnosis, seconds: float) -> dict:
    """The verdict on stderr, and where the backend keeps such news (Kubernetes: an Event)."""
    from ..hang import verdict

    try:
        print(diagnosis.verdict, file=run.stderr, flush=True)
    except (OSError, ValueError):
        pass
    found = verdict.report(diagnosis, seconds)
    try:
        if post_hang(run.backend, diagnosis.verdict):
            found["hang"]["reported_to_cluster"] = True
    except Exception as e:  # an extra: the verdict is on stderr and in report.json already
        print(f"mpilaunch: warning: the hang verdict was not posted to the cluster: {e}", file=run.stderr, flush=True)
    return found


class SamplingWatch:
    """A thread that samples the running job's stacks (``_run``) while the ``with`` block lasts, if
    ``active``; its end waits for a sample under way (each is bounded by the collection deadline)."""

    def __init__(self, name: str, active: bool):
        self._active = active
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        if self._active:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=DEFAULT_DEADLINE_S + 5)

    def _run(self) -> None:
        raise NotImplementedError


class StallWatch(SamplingWatch):
    """--stall-timeout: while the job runs, declares it hung once no rank printed anything and every
    rank's stacks stayed the same that long (``hang.stall``). Then it prints the verdict and, with
    --on-stall stop (the default), stops the workload; with --on-stall report the job runs on."""

    def __init__(self, run: RunContext, workload: Workload, stall_s: float | None, stop: bool = True):
        super().__init__("stall-watch", bool(stall_s))
        self.run, self.workload, self.stall_s, self.stop = run, workload, stall_s, stop
        self.found: dict | None = None  # report.json's hang and stacks, once hung
        self.found_at: float | None = None  # when the hang was declared (time.monotonic(): timings.phases)
        self.silent_since: float | None = None  # when the output it declared hung on stopped (likewise)
        self.hung = False  # and stopped for it

    def _last_output(self) -> float:
        output = getattr(self.workload, "output", None)
        return getattr(output, "last_line_at", None) or self._started

    def _run(self) -> None:
        from ..hang import stall, verdict

        self._started = time.monotonic()
        clock = stall.StallClock(self.stall_s)
        interval = stall.sample_interval(self.stall_s)
        while not self._done.wait(min(1.0, interval)):
            now = time.monotonic()
            if not clock.should_sample(now, self._last_output()):
                continue
            # a sample gets the full deadline: one cut short by a loaded host (64 ranks on 2 cores) found
            # every worker unreachable, and three such samples looked like a hang that named nobody
            taken = take_stacks(self.run, self.workload, DEFAULT_DEADLINE_S)
            if self._done.is_set() or self.workload.mode != "mpirun":
                return
            if taken is None:  # this sample failed (said in a warning line): the next one may not
                self._done.wait(max(0.0, interval - (time.monotonic() - now)))
                continue
            if clock.observe(time.monotonic(), self._last_output(), stall.coarse_signature(taken.stacks)):
                # the last sample is the verdict's collection: a job that hangs is not moving
                self._declare(verdict.diagnose(taken.stacks), taken.seconds)
                return
            self._done.wait(max(0.0, interval - (time.monotonic() - now)))

    def _declare(self, diagnosis: verdict.Diagnosis, seconds: float) -> None:
        self.found_at, self.silent_since = time.monotonic(), self._last_output()
        self.found = publish(self.run, diagnosis, seconds)
        self.found["hang"]["stall_timeout_s"] = self.stall_s
        if self.stop and not self._done.is_set():
            self.hung = True
            self.workload.note_stop(f"after its ranks hung for --stall-timeout {self.stall_s:g}s")
            self.workload.stop()
