"""The wait for a job's pods: every worker Ready (and the cluster launcher started) before
``--start-timeout``, else ``AllocationError`` (exit 3) quoting the cluster's own words.

All or nothing: scheduler messages (``0/16 nodes are available: 16 Insufficient
nvidia.com/gpu``), image pull errors, the gang's or the queue's note, the launcher
Job's refusals. What it learns of the pods (their objects, the launcher pod's name,
when they turned Ready) it leaves on the backend's public fields for what runs after.
"""

from __future__ import annotations

import time

from ...core import phases
from ...core.errors import AllocationError
from . import tools
from .api import ApiError
from .credentials import refused
from .pods import (
    JOB_LABEL,
    ROLE_LABEL,
    launcher_placement_hint,
    pod_phases,
    pod_problem,
    pod_ready,
    ready_poll_s,
    startup_phases,
    summarize,
    unschedulable_note,
)

# How often the wait for Ready retries a failed list of the pods.
POLL = 0.5


def list_pods(api, job: str) -> list[dict]:
    return api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={job}")["items"]


def fail_on_image_check(messages) -> None:
    """AllocationError with the image check's line (exit 3), where one of the pods' ``messages`` holds it."""
    line = next(filter(None, map(tools.image_problem, messages)), None)
    if line:
        raise AllocationError(line, tools.HINT + "; nothing was left in the cluster")


def wait_for_ready(backend, deadline: float, progress, wait) -> None:
    """Poll the job's pods until every worker is Ready (and the cluster launcher started), ``wait(s)``
    between polls; the backend's ``pods``, ``launcher_pod`` and ``ready_at`` are set as it goes."""
    names = [w.name for w in backend.plan.workers]
    total = len(names)
    started = time.monotonic()
    while True:
        try:
            pods = list_pods(backend.api, backend.job)
        except (ApiError, OSError) as e:
            if isinstance(e, ApiError) and e.status == 403:
                raise refused(e.status, e.message, "listing the job's pods") from None
            if time.monotonic() > deadline:
                raise AllocationError(f"cannot list the job's pods: {e}", "check the API server") from None
            time.sleep(POLL)
            continue
        by_name = {p["metadata"]["name"]: p for p in pods}
        backend.pods = by_name
        launcher = [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == "launcher"]
        if launcher:
            backend.launcher_pod = launcher[0]["metadata"]["name"]
        # each worker's pod: a spare's where one serves it (--spares, k8s/spares.py)
        by_name = {n: by_name[backend.member(n)] for n in names if backend.member(n) in by_name} | {
            name: pod for name, pod in by_name.items() if name not in names
        }
        for phase in startup_phases([by_name[n] for n in names if n in by_name], total):
            phases.mark(backend.phase_times, phase)
        for n in names:  # each pod's own (report.json's timings.workers: the timeline's worker rows)
            for phase in pod_phases(by_name.get(n)):
                phases.mark_worker(backend.worker_times, n, phase)
        ready = [n for n in names if n in by_name and pod_ready(by_name[n])]
        waits_for = backend.admission.note() if len(ready) < total else None
        # the gang's or queue's word first (it holds the pods back), else the scheduler's own
        note = waits_for or (unschedulable_note(list(by_name.values())) if len(ready) < total else None)
        if note:  # (ready, total) alone otherwise: the progress contract's old form
            progress(len(ready), total, note)
        else:
            progress(len(ready), total)
        problems, fatal = {}, {}
        for n in names:
            if n in ready:
                continue
            if n not in by_name:
                problems[n] = "pod missing"
                continue
            message, is_fatal = pod_problem(by_name[n])
            (fatal if is_fatal else problems)[n] = message
        launcher_ok = backend.launcher_placement.check_launcher_pod(backend, launcher, fatal, problems)
        fail_on_image_check(fatal.values())
        if fatal:
            raise AllocationError(
                f"workers cannot start: {summarize(fatal)}",
                "fix the image or pod settings; nothing was left in the cluster",
            )
        if len(ready) == total and launcher_ok:
            backend.ready_at = time.monotonic()
            return
        # every worker Ready, and the launcher pod the job waits for not made yet (a refusal?)
        no_launcher_pod = backend.launcher_placement.own_pods and not launcher and len(ready) == total
        if no_launcher_pod:
            fail_on_refused_launcher(backend)
        if time.monotonic() > deadline:
            if no_launcher_pod:
                problems[backend.launcher_name] = (
                    job_events(backend.api, backend.launcher_name) or "launcher pod not created"
                )
            reasons = summarize(problems) or "unknown"
            extra = events_for(backend.api, list(problems)[:3])
            if waits_for:  # the gang's or the queue's word first: it is why the pods wait
                reasons = f"{waits_for}; {reasons}"
            raise AllocationError(
                f"{total - len(ready)} of {total} workers not ready after --start-timeout "
                f"{backend.spec.start_timeout:g}s: {reasons}{extra}",
                (f"the job waited in Kueue LocalQueue {backend.opts.queue}; " if backend.opts.queue else "")
                + launcher_placement_hint(problems.get(backend.launcher_pod))
                + "ask for fewer GPUs, free capacity, or raise --start-timeout; nothing was left in the cluster",
            )
        wait(ready_poll_s(time.monotonic() - started, total + backend.launcher_placement.own_pods))


def events_for(api, pods: list[str]) -> str:
    """Recent warning events of a few pods that conditions do not show."""
    seen = []
    for pod in pods:
        try:
            events = api.get("v1", "events", fieldSelector=f"involvedObject.name={pod}")["items"]
        except (ApiError, OSError):
            return ""
        for ev in events:
            if ev.get("type") == "Warning" and ev.get("reason") != "FailedScheduling":
                text = f"{ev.get('reason')}: {ev.get('message', '').strip()}"
                if text not in seen:
                    seen.append(text)
    return (" [events: " + "; ".join(seen[:3]) + "]") if seen else ""


def fail_on_refused_launcher(backend) -> None:
    """The Job controller makes the launcher pod: a quota, LimitRange or PodSecurity refusal shows
    only in the Job's events (FailedCreate), and it would not fix itself before --start-timeout."""
    from .refusals import explain

    now = time.monotonic()
    if now < backend.launcher_events_at:
        return
    backend.launcher_events_at = now + 2.0  # an events list every 2 s at most
    said = job_events(backend.api, backend.launcher_name) or ""
    policy = explain(said) if said.startswith("FailedCreate") else None
    if policy is not None:
        raise AllocationError(
            f"cannot create the launcher pod of {backend.launcher_name}: {policy[0]}",
            policy[1] + "; nothing was left in the cluster",
        )


def job_events(api, name: str) -> str | None:
    try:
        events = api.get("v1", "events", fieldSelector=f"involvedObject.name={name}")["items"]
    except (ApiError, OSError):
        return None
    msgs = [f"{e.get('reason')}: {e.get('message')}" for e in events if e.get("type") == "Warning"]
    return msgs[-1] if msgs else None
