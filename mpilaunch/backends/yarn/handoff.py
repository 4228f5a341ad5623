"""--detach on YARN: hand the job to the launcher container, and find it again (wait, logs -f).

Submitting side (``hand_off``): once every worker's agent answers and the
launcher container runs, the launch description (``"detach": true``) and the
secret go into skein's key-value store, as for an attached job; then
mpilaunch lets go: it closes its connection to the ApplicationMaster and
stops its own skein driver. Neither ends the application (a skein
application outlives the driver that submitted it); the launcher container
ends it when the job is over (``detached.py``).

Coming back needs nothing but the ResourceManager and the NodeManagers: the
per-application credentials made at submission are gone with the process
that made them. ``wait`` and ``status`` read the application report (``state_of``) (the
outcome is in its final diagnostics, ``outcome``), ``logs -f`` follows the
launcher container's log through the NodeManager's REST API. Only ``stacks``
reads the key-value store again, with skein's copy of those credentials in
the owner's home directory on the cluster's file system
(``client.application_security``, ``stacks_kv``).
"""

from __future__ import annotations

import time

from ...core.errors import UsageError
from ..named_job import FAILED, KILLED, PENDING, RUNNING, SUCCEEDED, JobState
from . import outcome
from .client import is_mpilaunch, shorten, state_name

POLL_S = 1.0
NO_LAUNCHER_S = 30.0
_LOCAL_HINT = (
    "jobs run with --launcher local print their output on the submitting machine; "
    "`mpilaunch logs NAME --backend yarn` shows the containers' own logs"
)


def hand_off(backend, deadline: float, progress) -> None:
    """Wait until the job can start, give it to the launcher container, let go of the application."""
    backend.wait_ready(deadline, progress)
    backend.put_launch()
    # From here on the application is the launcher's to end: release() must not kill it.
    backend.released = True
    for obj in (backend.app, backend.client):
        try:
            obj.close()  # the AM connection; our own driver process (the application keeps running)
        except Exception:
            pass


def find_app(client, name: str):
    """The newest application of that name (names may be reused; the newest is the job asked for)."""
    import skein

    every = client.get_applications(name=name, states=list(skein.model.ApplicationState))
    apps = [a for a in every if is_mpilaunch(a)]  # another tool's application of that name is not the job
    if not apps:
        others = f" (only {len(every)} not submitted by mpilaunch)" if every else ""
        raise UsageError(
            f"no mpilaunch job named {name!r} on YARN{others}",
            "check the name (mpilaunch --name) and that HADOOP_CONF_DIR points at the cluster",
        )
    return max(apps, key=lambda a: a.start_time or 0)


#: YARN's application states in mpilaunch's phases (``named_job.PHASES``)
_PHASES = {"RUNNING": RUNNING, "SUCCEEDED": SUCCEEDED, "FAILED": FAILED, "KILLED": KILLED}


def state_of(name: str, report) -> JobState:
    """The job's state from its application report; once it ended, the outcome the launcher left
    in the final diagnostics (``outcome``)."""
    said, code, failure = outcome.outcome(state_name(report.state), state_name(report.final_status), report.diagnostics)
    elapsed = report.runtime.total_seconds() if report.runtime is not None else 0.0
    if code:
        failure = failure or f"job failed with exit code {code}"
    summary_facts = outcome.summary_facts(report.diagnostics) if code is not None else None
    # NEW, NEW_SAVING, SUBMITTED, ACCEPTED: not running yet
    phase = _PHASES.get(said, PENDING)
    return JobState(f"job {name} ({report.id})", phase, code, elapsed, failure, summary_facts or None)


def launcher_log_url(report, live: list[dict]) -> str | None:
    """Where the launcher container's log is: the live container listing, or the final diagnostics."""
    for c in live:
        if outcome.LAUNCHER_LOG in (c.get("containerLogFiles") or ()):
            return f"http://{c['_http']}/ws/v1/node/containerlogs/{c['id']}/{outcome.LAUNCHER_LOG}"
    found = outcome.launcher_log(report.diagnostics)
    if found:
        container, node = found
        return f"http://{node}/ws/v1/node/containerlogs/{container}/{outcome.LAUNCHER_LOG}"
    return None


def follow(client, name: str, stream, node_containers, http_text) -> int:
    """``logs -f``: print the launcher container's log as it grows, until the application ends."""
    printed = 0
    url = None
    workers_seen = None
    while True:
        report = find_app(client, name)
        ended = state_name(report.state) in outcome.TERMINAL_STATES
        if url is None:
            live = [] if ended else node_containers(client, report.id)
            url = launcher_log_url(report, live)
            if url is None and any("worker.log" in (c.get("containerLogFiles") or ()) for c in live):
                # the launcher is requested with the workers: long after them, there is none
                workers_seen = workers_seen or time.monotonic()
                if time.monotonic() - workers_seen > NO_LAUNCHER_S:
                    raise UsageError(
                        f"job {name} ({report.id}) has no launcher container (it runs with --launcher local)",
                        _LOCAL_HINT,
                    )
        if url is not None:
            text = outcome.log_contents(http_text(url) or "")
            if len(text) > printed:
                stream.write(text[printed:])
                stream.flush()
                printed = len(text)
        if ended:
            if url is None:
                raise UsageError(
                    f"job {name} ({report.id}) ended ({state_name(report.state)}) and no launcher log was found: "
                    f"{shorten(report.diagnostics, 200) or 'no diagnostics'}",
                    _LOCAL_HINT,
                )
            return 0
        time.sleep(POLL_S)
