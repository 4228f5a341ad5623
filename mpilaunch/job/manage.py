"""`mpilaunch render|status|logs|wait|delete|stacks`: look at, wait for or remove jobs on cluster backends.

The command line is parsed in ``cli``; these functions take parsed values, so
``cli`` depends on this module and never the other way round.
"""

from __future__ import annotations

import io
import sys
import time
from dataclasses import replace
from pathlib import Path

from .. import backends
from ..backends import protocols
from ..backends.named_job import JobEntry, JobStatus, NamedJob
from ..core.errors import UsageError
from ..core.exit_codes import EXIT_TIMEOUT
from ..core.spec import JobSpec


def render(spec: JobSpec) -> int:
    """Write what a run would create, without creating it (a dry run)."""
    from .lifecycle import run_spec

    buf = io.StringIO()
    run_spec(replace(spec, dry_run=True), stdout=buf, quiet=True)
    head, sep, manifests = buf.getvalue().partition("\nmanifests:\n")
    if sep:  # a cluster backend: applicable YAML, the plan as comments above it
        head = "".join(line + "\n" if line.startswith("#") else f"# {line}\n" for line in head.splitlines())
    sys.stdout.write(head + manifests if sep else head)
    return 0


def report(what: list[str], environ, stream, html: str | None = None) -> int:
    """``mpilaunch report [NAME|PATH [NAME|PATH]]``: a job's record summarized again (the newest
    of all, the newest of a job, or a given report.json), or two records side by side. The same
    job name twice compares its last two runs. ``html``: write the one record's timeline page there."""
    from ..runtime import record, summary

    if not what:
        found = [record.newest(environ)]
    elif len(what) == 2 and what[0] == what[1]:
        found = [record.find(what[0], environ, back=1), record.find(what[1], environ)]
    else:
        found = [record.find(w, environ) for w in what]
    if html:
        write_timeline(found[0][0], Path(html))
        stream.write(f"mpilaunch: timeline of job {found[0][0].get('job')} ({found[0][1]}) written to {html}\n")
        return 0
    if len(found) == 1:
        text = summary.lines(*found[0])
    else:
        (a, path_a), (b, path_b) = found
        text = [f"A: {path_a}", f"B: {path_b}", *summary.side_by_side(a, b)]
    stream.write("\n".join(text) + "\n")
    return 0


def write_timeline(report: dict, path: Path) -> None:
    """The record's timeline page (``timeline.py``), written whole or not at all."""
    from ..runtime import record
    from . import timeline, timeline_page

    try:
        text = timeline_page.page(timeline.model(report))
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a hand-edited or foreign report
        raise UsageError(
            f"cannot draw this report's timeline: {type(e).__name__}: {e}", "give a report.json mpilaunch wrote"
        ) from None
    try:
        record.write_text(path, text)
    except OSError as e:
        raise UsageError(
            f"cannot write {path}: {e.strerror or e}", "give --html a file in a directory you may write"
        ) from None


def job_action(action: str, args) -> int:
    """status / logs / wait / delete NAME on the backend named by ``args.backend``."""
    backend_cls = backends.load(args.backend)
    job = protocols.named_job(backend_cls, args) if backend_cls.capabilities.manage else None
    if job is None:
        raise UsageError(
            f"'{action}' applies to jobs on cluster backends, not --backend {args.backend}",
            f"{args.backend} jobs live and die with their mpilaunch process; use --backend k8s or yarn",
        )
    stream = ReaderAware(sys.stdout)
    try:
        if action == "status":
            print_status(job.status(), stream)
        elif action == "logs":
            job.logs(stream, bool(getattr(args, "follow", False)))
        elif action == "delete":
            job.delete(stream)
        else:
            return wait(job, args.timeout, stream, sys.stderr)
    except ReaderGone:
        # `mpilaunch logs -f JOB | head`: the reader has what it wanted; stop
        # quietly, as `kubectl logs -f | head` does, instead of a traceback
        pass
    return 0


def headline(entry: JobEntry) -> str:
    """A job's first line in `status`: what it is, its phase, its exit, how long, the rest."""
    state = entry.state
    return (
        f"{entry.title}  {state.phase}"
        + (f" {state.note}" if state.note else "")
        + (f" (exit {state.exit_code})" if state.exit_code is not None else "")
        + (f"  elapsed {state.elapsed:.0f}s" if state.elapsed is not None else "")
        + (f"  {entry.facts}" if entry.facts else "")
    )


def print_status(status: JobStatus, stream) -> None:
    for entry in status.entries:
        print(headline(entry), file=stream)
        for line in entry.details:
            print(f"  {line}", file=stream)
    for line in status.notes:
        print(line, file=stream)


def wait(job: NamedJob, timeout: float | None, stream, errors) -> int:
    """Until the job ends: its exit code becomes ours, its failure and closing summary are shown
    as its mpilaunch would have; ``timeout``: EXIT_TIMEOUT once that many seconds passed first."""
    from ..runtime import summary

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = job.state()
        if state.exit_code is not None:
            if state.exit_code != 0:
                print(f"mpilaunch: error: {state.failure}", file=errors)
            if state.summary:  # the closing summary, as the job's launcher left it
                print("\n".join(summary.lines(state.summary)), file=errors)
            print(
                f"{state.label} {state.phase.lower()} (exit {state.exit_code}) after {state.elapsed or 0:.0f}s",
                file=stream,
            )
            return state.exit_code
        if deadline is not None and time.monotonic() > deadline:
            print(f"mpilaunch: error: {state.label} still {state.phase} after --timeout {timeout:g}s", file=errors)
            return EXIT_TIMEOUT
        time.sleep(job.poll_s)


class ReaderGone(Exception):
    """Whoever read the command's standard output went away (a closed pipe)."""


class ReaderAware:
    """The output stream of status/logs/wait/delete. A closed pipe on it
    raises ReaderGone, so it is not mistaken for a connection to the cluster
    that broke (BrokenPipeError, too) and reported as an error."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    @staticmethod
    def _guarded(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise ReaderGone from None


def stacks(args) -> int:
    """``mpilaunch stacks NAME``: every rank's stacks of a running job, grouped, and the hang verdict.

    Through the mpilaunch that runs the job on this machine (attached, any
    backend; a YARN job's either launcher): its run directory's context file
    says where the workers' agents listen, and with which secret. Only a run
    directory of the user's own counts, and no credential of its context
    (``hang.local_job``; the exec API's are the user's own configuration's:
    ``with_own_credentials``). Without one,
    the job found by name on a cluster backend (``NamedJob.stacks``:
    Kubernetes, the exec API into its worker pods with the user's credentials;
    YARN, its launcher container asked through the application's key-value
    store). Exit 0 once the stacks are shown (whatever they say).
    """
    import json

    from ..hang import collect, local_job, verdict

    # only this user's own run directories, and of their contexts no credential (local_job)
    contexts = local_job.one_per_job(local_job.running_contexts(args.name, args.backend))
    if len(contexts) > 1:
        raise UsageError(f"{len(contexts)} running jobs are named {args.name!r}", "give each job its own --name")
    if contexts:
        context = contexts[0]
        if local_job.needs_credentials(context):
            context = with_own_credentials(context, args)
        python = context.get("probe_python") or sys.executable
        collection = collect.collect_from_context(context, python, deadline_s=args.deadline)
    else:
        # no mpilaunch here runs it: a cluster backend may reach a detached job itself
        collection = protocols.stacks_by_name(backends.load(args.backend), args)
        if collection is None:
            raise UsageError(
                f"no running {args.backend} job named {args.name!r} started from this machine",
                f"give the job's --name and --backend, and run this where its mpilaunch runs "
                f"(a {args.backend} job's workers are reached only through it)",
            )
    diagnosis = verdict.diagnose(collection.stacks)
    if args.json:
        print(json.dumps(verdict.report(diagnosis, collection.seconds), indent=2))
    else:
        print("\n".join(diagnosis.lines()))
    return 0


def with_own_credentials(context: dict, args) -> dict:
    """A context found in a run directory on this machine (``local_job.stacks_context``: no
    credential in it), with the exec channel's credentials of the user's own configuration
    (``protocols.exec_credentials``: server, TLS settings, token; --kubeconfig and --context as for
    ``status``, the job's namespace where --namespace names none)."""
    found = dict(context)
    creds = protocols.exec_credentials(backends.load(args.backend), args, found.pop("namespace", None))
    if creds is None:
        raise UsageError(
            f"job {args.name!r} is reached with credentials the {args.backend} backend has none of",
            "give the job's --backend",
        )
    return {**found, **creds}
