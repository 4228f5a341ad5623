"""--spares in the lifecycle: a worker that ``--preflight enforce`` rejects, or that is lost with
``--retries``, is swapped for a waiting spare (the backend's ``replace_workers``), and the swap is
said on stderr and kept for the record.

Before the program: the rejected workers are swapped and every worker is checked again (the link
test needs them all, and a spare may be bad too), for as long as spares wait and at most
``MAX_PREFLIGHT_ROUNDS`` checks; when the spares run out, ``--preflight enforce`` stops the job as
it does without spares.

A launcher in the cluster that swaps spares in itself (k8s: the launcher pod, ``--retries`` with
``--spares``) runs this same lifecycle there; the submitting side, which follows it, takes its
ended attempts and swaps into the record afterwards (``launcher_relaunches``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..backends.protocols import ClusterLauncher, ReplacesWorkers
from ..core import phases
from ..core.errors import PreflightFailed
from ..runtime import record
from ..runtime.progress import WaitProgress
from ..workloads.base import RunContext, Workload

#: the most preflight checks one job runs: the first, and one after each swap
MAX_PREFLIGHT_ROUNDS = 3
#: how long a rejected worker's swap waits for spares still starting, and how often it looks
SPARE_START_S = 60.0
SPARE_LOOK_S = 0.25


def waiting(backend) -> int:
    return backend.spares_waiting() if isinstance(backend, ReplacesWorkers) else 0


def wait_for_spares(run: RunContext, backend, needed: int) -> int:
    """Until ``needed`` spares wait, while enough are still starting (the backend's
    ``spares_coming``), at most SPARE_START_S; how many wait then. The spares are made after the
    workers and never waited for, so a preflight done fast (the launcher pod's, beside the workers)
    could end the job while the spare it needed was a second from Ready (seen on real pods)."""
    if not isinstance(backend, ReplacesWorkers):
        return 0
    until = time.monotonic() + SPARE_START_S
    left = backend.spares_waiting()
    while left < needed and left + backend.spares_coming() >= needed and time.monotonic() < until:
        time.sleep(SPARE_LOOK_S)
        left = backend.spares_waiting()
    return left


def swap(run: RunContext, backend, names: list[str], why: str, swaps: list[dict], t0: float) -> dict[str, str]:
    """Replace ``names`` (spares first); say which spare serves which worker; keep it in ``swaps``."""
    taken = backend.replace_workers(names, why=why) or {}
    if taken:  # a launcher in the cluster tells the submitting side (ReplacesWorkers.swapped)
        backend.swapped(taken, why, run.result if why == "lost" else None)
    for worker, spare in taken.items():
        print(f"mpilaunch: spare {spare} takes the place of worker {worker} ({why})", file=run.stderr, flush=True)
        swaps.append({"worker": worker, "spare": spare, "why": why, "at_s": round(time.monotonic() - t0, 3)})
    return taken


def preflight(
    run: RunContext, workload: Workload, rewrite_context: Callable[[], None], swaps: list[dict], t0: float
) -> dict:
    """``preflight_run.run``; with ``--preflight enforce`` and spares waiting for every rejected worker,
    swap them and check again. Returns the record's ``preflight`` (with ``swapped_rounds``: the
    findings of each check that swapped workers); raises PreflightFailed as ``preflight_run.run``."""
    backend = run.backend
    earlier: list[dict] = []
    while True:
        try:
            from ..workloads import preflight_run  # --preflight only: its checks and MPI probes

            found = preflight_run.run(run, workload)
        except PreflightFailed as e:
            failed = list((e.found or {}).get("failed_workers") or [])
            if earlier and e.found is not None:
                e.found["swapped_rounds"] = earlier
            left = waiting(backend)
            if failed and len(failed) > left:  # spares still starting (made after the workers): wait
                left = wait_for_spares(run, backend, len(failed))
            if not failed or len(earlier) + 1 >= MAX_PREFLIGHT_ROUNDS or len(failed) > left:
                if run.spec.spares:
                    e.hint = (
                        f"{len(failed)} to swap, {left} spare{'s' if left != 1 else ''} waiting"
                        + (f" after {len(earlier)} swap{'s' if len(earlier) > 1 else ''}" if earlier else "")
                        + f"; {e.hint}"
                    )
                raise
            earlier.append(e.found)
            swap(run, backend, failed, "preflight", swaps, t0)
            with WaitProgress(workload.waiting_for(), run.stderr, quiet=run.quiet) as progress:
                backend.wait_ready(time.monotonic() + run.spec.start_timeout, progress)
            rewrite_context()
            continue
        if earlier:
            found["swapped_rounds"] = earlier
        return found


def launcher_relaunches(backend, attempts: list, swaps: list, origin: float, t_run: float, first: int) -> float:
    """The attempts a launcher in the cluster ended and ran again itself during this one (a spare
    swapped in for a lost worker: ``ClusterLauncher.relaunched_in_launcher``), into the record's
    ``attempts`` and ``spares`` (``record_relaunches``); returns when the attempt still going started."""
    if not isinstance(backend, ClusterLauncher):
        return t_run
    done = backend.relaunched_in_launcher()
    return record_relaunches(done, attempts, swaps, backend.worker_times, origin, t_run, first)


def record_relaunches(
    relaunched: list[dict], attempts: list, swaps: list, worker_times: dict, origin: float, t_run: float, first: int
) -> float:
    """``launcher_relaunches``' bookkeeping (pure but for the lists it extends), in order."""
    for taken in relaunched:
        swaps.extend({**entry, "at_s": round(taken["at"] - origin, 3)} for entry in taken["swaps"])
        if not taken["ended"]:
            continue  # --preflight enforce's swap, before the program: no attempt ended
        number = len(attempts) + first
        for entry in taken["swaps"]:  # the lost worker's phases keep their attempt
            phases.retire_worker(worker_times, entry["worker"], number)
        attempts.append(record.launcher_attempt_record(number, origin, t_run, taken))
        t_run = taken["at"]
    return t_run
