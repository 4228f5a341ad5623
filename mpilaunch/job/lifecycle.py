"""The one job lifecycle: allocate -> wait until ready -> start -> watch -> collect -> release.

Every mode (mpirun, PS) and every backend (local, k8s, yarn) goes through
:func:`run_job`, and so do the in-cluster launchers (``backends/<name>/launcher.py``), with a
backend that stands for workers someone else allocated. What differs between
an mpirun job and a PS job is the *workload* (``workloads/``): what starts on
which worker, and how success and failure are judged.

Teardown lives in one ``finally`` so success, a failed rank or task, a lost
worker, Ctrl-C, SIGTERM, timeouts and crashes all release the same things.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from .. import backends
from ..backends.protocols import ClusterLauncher, ReplacesWorkers
from ..core import phases
from ..core.errors import Interrupted, MpilaunchError, PreflightFailed, UsageError
from ..core.exit_codes import EXIT_FAILED, EXIT_HUNG, EXIT_PLACEMENT, EXIT_TIMEOUT, EXIT_WORKER_LOST
from ..core.result import JobResult, LostWorker, lost_workers_failure, worker_location
from ..core.spec import JobSpec
from ..runtime import artifacts, record, summary
from ..runtime.interrupts import (  # noqa: F401  (INTERRUPT_SIGNALS: the lifecycle's tests read it here)
    INTERRUPT_SIGNALS,
    ignore_interrupts,
    interrupts_raise,
    keeps_caller_signal_handlers,
)
from ..runtime.progress import WaitProgress
from ..runtime.record import write_report  # here too: lifecycle.write_report, its old home
from ..runtime.rundir import make_rundir, remove_tree, sweep_stale_rundirs  # launchers import them here too
from ..workloads import hang_watch, workload_class
from ..workloads.base import RunContext, Workload
from ..workloads.straggler_watch import StragglerWatch
from . import spares

# How often the run asks the backend whether a worker disappeared: one API
# list per interval on a cluster, a waitpid per agent locally.
WATCH_INTERVAL_S = 2.0
# how soon the lost-worker watch looks after the backend says a worker changed
CHANGE_SLICE_S = 0.05

# ------------------------------------------------------------------ entry


def run_spec(spec: JobSpec, *, stdout=None, stderr=None, environ=None, quiet=False) -> JobResult:
    """Plan, then run (or with --dry-run print) the job a spec describes."""
    started = time.monotonic()  # timings.phases count from here: planning included
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    environ = dict(os.environ if environ is None else environ)
    backend_cls = backends.load(spec.backend)
    backend_cls.check_spec(spec)
    job_name = job_name_for(spec)
    workload = workload_class(spec).prepare(spec, backend_cls, job_name, environ)
    keep = None if spec.dry_run or spec.detach else record.keep_records(environ)  # bad input: before anything
    artifacts.check_destination(spec, keep, spec.output_dir)
    output_dir = prepare_output_dir(spec)
    rundir = make_rundir(job_name)
    try:
        backend = backend_cls(spec, workload.plan, rundir, cluster_launcher_allowed=workload.can_use_cluster_launcher)
        workload.bind(backend, rundir, environ)
    except BaseException:  # bad input the backend or the launch found: nothing may stay behind
        remove_tree(rundir)
        raise
    if spec.dry_run:
        workload.print_dry_run(backend, environ, stdout)
        remove_tree(rundir)
        return JobResult(job_name=job_name, exit_code=0)
    if spec.detach:
        return submit_detached(spec, workload, backend, rundir, stdout=stdout, stderr=stderr, quiet=quiet)
    return run_job(
        spec,
        workload,
        backend,
        rundir,
        output_dir,
        stdout=stdout,
        stderr=stderr,
        environ=environ,
        quiet=quiet,
        started=started,
        keep_records=keep,
    )


@keeps_caller_signal_handlers
def run_job(
    spec: JobSpec,
    workload: Workload,
    backend,
    rundir: Path,
    output_dir: Path | None,
    *,
    stdout,
    stderr,
    environ: dict,
    quiet: bool,
    started: float | None = None,
    keep_records: int | None = None,
) -> JobResult:
    """The lifecycle itself. Releases the backend and removes ``rundir`` on every exit path.

    ``timings`` gets the durations allocate_s, run_s, total_s and ``phases``:
    when each phase was reached, in seconds since ``started`` (``phases.py``).
    ``keep_records``: the job keeps its record (``record.py``) and prints its closing summary
    (``summary.py``), one line with ``quiet``; None (an in-cluster launcher, whose submitting
    mpilaunch does both): only ``--output-dir``'s report.json.
    """
    result = JobResult(
        job_name=workload.job_name, exit_code=EXIT_FAILED, output_dir=str(output_dir) if output_dir else None
    )
    run = RunContext(
        spec=spec,
        backend=backend,
        rundir=rundir,
        context_file=rundir / "context.json",
        output_dir=output_dir,
        environ=environ,
        stdout=stdout,
        stderr=stderr,
        quiet=quiet,
        result=result,
    )
    timings = result.timings
    lost: list[LostWorker] = []
    attempts: list[dict] = []
    t0 = time.monotonic()
    origin = t0 if started is None else started  # the report's clock: its phases, attempts, workers
    seen: dict[str, float] = {}  # the lifecycle's own phases; backend and workload keep theirs
    hang: dict = {}  # report.json's "hang" and "stacks", where the job was found hung or timed out
    checked: dict = {}  # report.json's "preflight" (--preflight)
    swaps: list[dict] = []  # report.json's "spares" (--spares): which spare took which worker's place
    try:
        with interrupts_raise(then_ignore=True):
            # allocate, and wait until every worker is ready (the backend's diagnosis on timeout)
            backend.allocate()
            phases.mark(seen, "allocated")
            with WaitProgress(workload.waiting_for(), stderr, quiet=quiet) as progress:
                backend.wait_ready(t0 + spec.start_timeout, progress)
            phases.mark(seen, "workers_ready")
            timings["allocate_s"] = round(time.monotonic() - t0, 3)
            write_context(run.context_file, workload.job_name, backend)
            workload.check_program(run)  # where the ranks' programs are not this machine's
            # the workers checked before the program (issue 52), where mpirun runs: an in-cluster
            # launcher checks them itself, with the same carried --preflight
            if spec.preflight != "off" and not backend.launcher_in_cluster:
                try:
                    checked["preflight"] = spares.preflight(
                        run,
                        workload,
                        lambda: write_context(run.context_file, workload.job_name, backend),
                        swaps,
                        origin,
                    )
                finally:  # enforce's stop too: the ledger gives the check its own share
                    phases.mark(seen, "preflight_done")

            # start the workload, then watch it until its outcome is decided;
            # with --retries, replace lost workers and start it again
            t_run = time.monotonic()
            deadline = None if spec.timeout is None else t_run + spec.timeout
            first = workload.attempt  # a relaunched launcher in the cluster counts on from its own
            workload.start(run)
            while True:
                with (
                    LostWorkerWatch(backend, workload) as watch,
                    hang_watch.StallWatch(run, workload, spec.stall_timeout, stop=spec.on_stall == "stop") as stall,
                    # sampled where mpirun runs (an in-cluster launcher samples with the carried option)
                    StragglerWatch(
                        run, workload, None if backend.launcher_in_cluster else spec.straggler_report
                    ) as stragglers,
                ):
                    result.exit_code, result.failure = workload.watch(run, deadline)
                sampled = stragglers.found()
                if sampled is not None:
                    checked["stragglers"] = sampled
                if watch.fatal is not None:
                    raise watch.fatal
                hang.update(stall.found or {})
                if stall.found_at is not None:  # the timeline: when the output stopped, when it was declared hung
                    phases.mark(seen, "stalled", stall.silent_since)
                    phases.mark(seen, "hang_found", stall.found_at)
                if stall.hung:
                    result.exit_code, result.failure = EXIT_HUNG, hung_failure(spec, stall.found)
                if ran_past(deadline, result.exit_code):
                    phases.mark(seen, "timed_out")
                    hang.update(stop_at_timeout(run, workload) or {})
                phases.mark(seen, "workload_done")
                # what a launcher in the cluster relaunched itself (a spare swapped in)
                t_run = spares.launcher_relaunches(backend, attempts, swaps, origin, t_run, first)
                lost = diagnose_lost_workers(backend, workload, result, watch.lost)
                attempts.append(record.attempt_record(len(attempts) + first, origin, t_run, result, lost, workload))
                if not should_retry(spec, len(attempts) + first - 1, result.exit_code, lost, backend):
                    break
                t_run = time.monotonic()
                retry(run, workload, backend, lost, len(attempts) + first, swaps, origin)
            timings["run_s"] = round(time.monotonic() - t_run, 3)
    except MpilaunchError as e:
        result.exit_code = e.exit_code
        result.failure = e.message
        if isinstance(e, PreflightFailed) and e.found is not None:
            checked["preflight"] = e.found
        if not isinstance(e, Interrupted):
            raise
    finally:
        # stop, release, collect: the same on every exit path
        ignore_interrupts()
        workload.stop()
        collected = artifacts.collect_for(run, workload)  # --collect, --timeline: after the ranks, before the release
        workers = finish_backend(backend, result, stderr)
        phases.mark(seen, "released")
        workload.close()
        timings["total_s"] = round(time.monotonic() - t0, 3)
        timings["phases"] = phases.since(origin, seen, backend.phase_times, workload.phase_times())
        timings["workers"] = phases.since_by_worker(origin, backend.worker_times)
        workload.collect(run)
        body = {
            "mode": workload.mode,
            **workload.report(run, workers),
            "lost_workers": [w.worker for w in lost],
            "lost": [w.__dict__ for w in lost],
        }
        if spec.retries:
            body["attempts"] = attempts
        body.update(hang, **({"collected": collected} if collected else {}))
        if spec.spares:
            body["spares"] = {"count": spec.spares, "swaps": swaps}
        body.update(checked)
        body["ledger"] = summary.ledger({"plan": workload.plan.to_dict(), "timings": timings, **body})
        now, wall = time.monotonic(), time.time()
        began = record.wall_clock(origin, now, wall)
        report = {**record.common_fields(body, began, wall), **body}
        result.report = report
        text = report_text(report, stderr)
        if output_dir is not None and text is not None:
            save_report(output_dir / "report.json", report, stderr, text)
        if keep_records is not None:  # --output-dir's report.json is the one named, if any
            files = artifacts.staged(run) if collected else None  # --collect's, without --output-dir
            kept = (
                keep_record(report, environ, keep_records, began, stderr, text, files)
                if keep_records and text
                else None
            )
            named = output_dir / "report.json" if output_dir is not None else kept
            print_summary(report, named, stderr, quiet, raised=sys.exc_info()[0] is not None)
        remove_tree(rundir)
        # and what this job's SIGKILLed agents (a lost worker) or an earlier killed mpilaunch left
        sweep_stale_rundirs()
    return result


@keeps_caller_signal_handlers
def submit_detached(
    spec: JobSpec, workload: Workload, backend, rundir: Path, *, stdout, stderr, quiet: bool
) -> JobResult:
    """--detach: allocate and hand the job to its launcher in the cluster, then leave it running.

    The launcher runs this same lifecycle in the cluster and, because the job
    is detached, releases the workers itself at the end (``backends/<name>/launcher.py``).
    Anything that fails before the hand-off releases everything, as always.
    """
    t0 = time.monotonic()
    handed_off = False
    try:
        if not isinstance(backend, ClusterLauncher):  # check_spec refused it already: a caller that did not ask
            raise UsageError(f"--detach is not available with the {backend.name} backend", "run without --detach")
        with interrupts_raise():
            backend.allocate()
            with WaitProgress(workload.waiting_for(), stderr, quiet=quiet) as progress:
                backend.hand_off(t0 + spec.start_timeout, progress)
            handed_off = True
    finally:
        if not handed_off:
            ignore_interrupts()
            backend.release()
        remove_tree(rundir)
    name, flags = workload.job_name, backend.manage_flags()
    print(
        f"mpilaunch: submitted job {name} ({len(workload.plan.workers)} workers, {workload.plan.ranks} ranks); "
        f"it runs on without this terminal",
        file=stdout,
    )
    for what, command in (
        ("follow", f"logs -f {name}"),
        ("state", f"status {name}"),
        ("wait", f"wait {name}"),
        ("remove", f"delete {name}"),
    ):
        print(f"  {what + ':':8s} mpilaunch {command} {flags}", file=stdout)
    return JobResult(job_name=name, exit_code=0)


# ------------------------------------------------------------------ steps


def job_name_for(spec: JobSpec) -> str:
    return spec.name or f"mpl-{os.urandom(3).hex()}"  # not secrets: hmac/hashlib cost a launch ~5 ms


def prepare_output_dir(spec: JobSpec) -> Path | None:
    """--output-dir, created up front so a typo fails before anything is allocated."""
    if not spec.output_dir:
        return None
    output_dir = Path(spec.output_dir)
    if not spec.dry_run:
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"cannot create --output-dir {output_dir}: {e.strerror}", "choose a writable directory"
            ) from None
    return output_dir


def write_context(path: Path, job_name: str, backend) -> None:
    """The shim's context file: how to reach each worker through the backend's exec channel."""
    # probe_python: how ``mpilaunch stacks`` runs its probe on the workers (hang.collect)
    path.write_text(
        json.dumps(
            {
                "job": job_name,
                "backend": backend.name,
                **backend.exec_context(),
                "probe_python": hang_watch.probe_python(backend),
            }
        )
    )


def ran_past(deadline: float | None, exit_code: int) -> bool:
    """Whether the watch ended at --timeout (a rank's own exit code 124 is not a timeout)."""
    return deadline is not None and exit_code == EXIT_TIMEOUT and time.monotonic() >= deadline


def stop_at_timeout(run: RunContext, workload: Workload) -> dict | None:
    """--timeout passed: stop the workload now, while the workers are still allocated.

    The stop is the workload's own (mpirun: SIGTERM to its process group, SIGKILL
    after a grace), so a rank that handles SIGTERM still gets its chance and a
    rank that does not dies at once. Whatever looks at a hung job before it is
    stopped goes here, before ``workload.stop()``: every rank's stacks and the hang
    verdict (bounded: hang_watch.TIMEOUT_DIAGNOSIS_S), report.json's ``hang``/``stacks``.
    """
    found = hang_watch.diagnose(run, workload)
    workload.note_stop(f"at --timeout {run.spec.timeout:g}s")
    workload.stop()
    return found


def hung_failure(spec: JobSpec, found: dict | None) -> str:
    """The failure of a job stopped by --stall-timeout: its verdict, without the line's prefix."""
    why = f"the job hung: no output and unchanged stacks for --stall-timeout {spec.stall_timeout:g}s"
    verdict = (found or {}).get("hang", {}).get("verdict", "")
    return why + (f"; {verdict.split(': ', 2)[-1]}" if verdict else "")


def finish_backend(backend, result: JobResult, stderr) -> dict:
    """Tell the backend how the job ended (YARN final status), collect worker facts, release everything.

    The outcome and the facts are extras, the release is not: a backend hook that raises
    (against its contract) costs a warning, never the release or the rest of the teardown.
    """
    workers: dict = {}
    try:
        extra = backend.job_finished(result.exit_code, result.failure)
        if extra and result.failure:
            result.failure = f"{result.failure}\n{extra}"
        workers = backend.describe_workers()
    except MpilaunchError as e:  # the backend's verdict (its credentials refused): the job's, unless it has one
        if result.exit_code == 0 or not result.failure:
            result.exit_code, result.failure = e.exit_code, e.message
    except Exception as e:
        print(f"mpilaunch: warning: the {backend.name} backend could not report the job's end: {e}", file=stderr)
    finally:
        try:
            backend.release()
        except Exception as e:
            print(
                f"mpilaunch: warning: releasing the job's workers failed: {e}; "
                f"check what is left with the cluster's own tools",
                file=stderr,
            )
    return workers


def diagnose_lost_workers(backend, workload: Workload, result: JobResult, seen: dict[str, str]) -> list[LostWorker]:
    """A failed job whose workers disappeared failed because of that, in every mode alike.

    ``seen``: what the watch found during the run (it stopped the workload).
    The lost workers lead the failure text; what the MPI runtime or the task
    made of it follows, as the tail.
    """
    if not seen and (
        result.exit_code in (EXIT_TIMEOUT, EXIT_HUNG) or (result.exit_code == 0 and workload.all_units_reported())
    ):
        return []
    reasons = seen or backend.lost_workers(settle=True)
    if not reasons:
        return []
    facts = backend.describe_workers()
    lost = [
        LostWorker(worker=name, reason=why, where=worker_location(facts.get(name) or {}), units=workload.units_on(name))
        for name, why in sorted(reasons.items())
    ]
    result.exit_code = EXIT_WORKER_LOST
    result.failure = lost_workers_failure(lost) + (f"\n{result.failure}" if result.failure else "")
    return lost


def should_retry(spec: JobSpec, attempts_done: int, exit_code: int, lost: list[LostWorker], backend=None) -> bool:
    """Relaunch on the same allocation? After a lost worker the backend can replace now (a launcher pod
    with no spare Ready cannot: it ends, and the submitting side relaunches), or a failed rank with
    --retry-rank-failures."""
    if attempts_done > spec.retries or exit_code in (0, EXIT_TIMEOUT, EXIT_HUNG, EXIT_PLACEMENT):
        return False
    if lost and isinstance(backend, ReplacesWorkers):
        return backend.can_replace([w.worker for w in lost])
    return bool(lost) or spec.retry_rank_failures


def retry(
    run: RunContext, workload: Workload, backend, lost: list[LostWorker], number: int, swaps: list, t0: float
) -> None:
    """Replace the lost workers (a waiting spare, else a new pod, container or agent of the same name)
    and start the workload again."""
    spec = run.spec
    names = [w.worker for w in lost]
    what = f"replacing {', '.join(names)}" if names else "on the same workers"
    print(
        f"mpilaunch: attempt {number} of {spec.retries + 1}: relaunching {what} "
        f"(attempt {number - 1}: {(run.result.failure or '').splitlines()[0] if run.result.failure else 'failed'})",
        file=run.stderr,
        flush=True,
    )
    workload.stop()
    workload.reset(number)
    if names:
        if not isinstance(backend, ReplacesWorkers):  # check_spec refused --retries already
            raise UsageError(f"the {backend.name} backend cannot replace workers", "drop --retries")
        for name in names:  # the lost worker's phases keep their attempt; the replacement's are its own
            phases.retire_worker(backend.worker_times, name, number - 1)
        spares.swap(run, backend, names, "lost", swaps, t0)
    if isinstance(backend, ClusterLauncher):
        backend.relaunch(number)  # the cluster's launcher: a new one for this attempt
    if names or backend.launcher_in_cluster:
        what = (f"{len(names)} replacement worker" + ("s" if len(names) > 1 else "")) if names else "the new launcher"
        with WaitProgress(f"waiting for {what}", run.stderr, quiet=run.quiet) as progress:
            backend.wait_ready(time.monotonic() + spec.start_timeout, progress)
        write_context(run.context_file, workload.job_name, backend)
    workload.start(run)


class LostWorkerWatch:
    """Asks the backend every few seconds whether a worker disappeared, and stops the workload if one did.

    Without it a lost worker is noticed only when the MPI runtime notices,
    and some never do: hydra can wait forever for a dead proxy, and the
    processes of a deleted kwok pod outlive it. Only the backend's
    authoritative signs count here (a pod gone or failed, a container ended,
    an agent process exited), never a slow answer.
    """

    def __init__(self, backend, workload: Workload, interval: float | None = None):
        self.backend = backend
        self.workload = workload
        self.interval = WATCH_INTERVAL_S if interval is None else interval  # read at each watch: tests shorten it
        self.lost: dict[str, str] = {}
        self.fatal: MpilaunchError | None = None  # the backend can no longer watch (its credentials failed)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lost-worker-watch", daemon=True)

    def __enter__(self) -> "LostWorkerWatch":
        takes_them = isinstance(self.backend, ClusterLauncher) and self.backend.launcher_takes_lost_workers()
        if not takes_them:  # else the launcher in the cluster watches, swaps a spare in and goes on
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 30)

    def _run(self) -> None:
        changes = self.backend.worker_changes if isinstance(self.backend, ReplacesWorkers) else contextlib.nullcontext
        try:
            with changes() as changed:
                self._watch(changed)
        except Exception:  # no watch to be had (refused, unreachable): the looks keep their interval
            self._watch(None)

    def _next_look(self, changed) -> bool:
        """Until the next look: the interval, or sooner where the backend says a worker changed
        (polled in short slices: the exit must not wait for the slice). False once done."""
        if changed is None:
            return not self._done.wait(self.interval)
        until = time.monotonic() + self.interval
        while not changed.is_set() and time.monotonic() < until:
            if self._done.wait(CHANGE_SLICE_S):
                return False
        changed.clear()
        return not self._done.is_set()

    def _watch(self, changed) -> None:
        while self._next_look(changed):
            try:
                lost = self.backend.lost_workers()
            except MpilaunchError as e:  # e.g. the cluster's credentials failed: stop while they still work
                self.fatal = e
                self.workload.note_stop(f"after {e.message}")
                self.workload.stop()
                return
            except Exception:  # a flaky API call is no verdict; ask again next time
                continue
            if lost and not self._done.is_set():
                self.lost = lost
                names = sorted(lost)
                self.workload.note_stop(
                    f"after worker{'s' if len(names) > 1 else ''} {', '.join(names)} "
                    f"{'were' if len(names) > 1 else 'was'} lost",
                    broken=True,
                )
                self.workload.stop()
                return


def report_text(report: dict, stderr) -> str | None:
    """report.json's text, made once for both places it goes; None (and one warning) when
    something in it cannot be encoded."""
    try:
        return record.report_text(report)
    except (TypeError, ValueError) as e:
        warn(f"mpilaunch: warning: this job's report cannot be written: {e}", stderr)
        return None


def keep_record(report: dict, environ: dict, keep: int, began: float, stderr, text: str, files=None) -> Path | None:
    """The job's record in the user's state directory (``record.py``), with ``files`` collected
    (``artifacts.py``); a failure is one warning line and no record, never the job's exit code."""
    try:
        return record.keep(report, environ, keep, began, text, files)
    except (OSError, TypeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        warn(
            f"mpilaunch: warning: this job's record was not kept in {record.runs_dir(environ)}: {why}; "
            f"set {record.STATE_DIR_ENV} to a writable directory",
            stderr,
        )
        return None


def print_summary(report: dict, where: Path | None, stderr, quiet: bool, raised: bool) -> None:
    """The closing summary (``summary.py``), after the progress bar has gone: a few lines, one
    with ``quiet``. A job that ends in an error raised through here (its allocation failed or
    timed out, the cluster refused its credentials) prints that error alone, one line and a
    hint as every error is; its record is kept all the same (``mpilaunch report NAME``)."""
    if raised:
        return
    text = (
        summary.one_line(report, str(where) if where else None)
        if quiet
        else "\n".join(summary.lines(report, str(where) if where else None))
    )
    warn(text, stderr)


def warn(text: str, stderr) -> None:
    """A line of the teardown on stderr: a reader that went away costs the line, nothing else."""
    try:
        print(text, file=stderr, flush=True)
    except (OSError, ValueError):
        pass


def save_report(path: Path, report: dict, stderr, text: str | None = None) -> None:
    """write_report in the lifecycle's teardown: a failure (the directory removed, a full disk)
    is one warning line; the job's exit code and the rest of the teardown stand."""
    try:
        write_report(path, report, text)
    except (OSError, TypeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        try:
            print(f"mpilaunch: warning: cannot write {path}: {why}", file=stderr, flush=True)
        except (OSError, ValueError):
            pass


# ------------------------------------------------------------------ signals


__all__ = ["run_spec", "run_job", "JobResult"]
