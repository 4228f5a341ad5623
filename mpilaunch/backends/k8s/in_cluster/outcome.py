"""How a detached job's launcher ended, read from its Job: the pure rules of the detached job's reaper.

A detached job's launcher records the job's outcome in the root ConfigMap
(``result.json``) and releases the workers itself, on every exit path it
lives to see. When it does not live to see one (its container OOM-killed or
SIGKILLed, its pod deleted before the container ran, its node lost, its pod
never started: image pull error, unschedulable, quota), the job's reaper
(``backends/k8s/in_cluster/detached.py``) records the ending these rules read from
the launcher Job's status, and releases the workers.

The reaper reads the Job, by name, and not its pod: the Job controller names
the pod (``<job>-launcher-xxxxx``), and reading pods by an unknown name
could only be granted namespace-wide. The detached launcher Job's
``podFailurePolicy`` (``k8s-launcher.yaml.j2``) makes the controller write
the pod's name, and its exit code or its disruption, into the Job's
condition instead.

The reaper judges by when *it* saw things (its monotonic clock), never by
the API's timestamps, as ``mpilaunch/core/orphan.py`` does.
"""

from __future__ import annotations

import re
from collections import namedtuple

from ....core.exit_codes import EXIT_ALLOCATION, EXIT_TIMEOUT, EXIT_WORKER_LOST

Ending = namedtuple("Ending", "exit_code failure release_launcher")
Ending.__doc__ = """How the launcher ended: the job's exit code, the failure line (None: success),
and whether its Job still holds a pod that must be deleted to free its node (stuck Pending, node lost)."""

Seen = namedtuple("Seen", "started job_seen was_ready unready_since")
Seen.__doc__ = """What the reaper saw of the launcher Job: when it started watching, whether the Job
ever existed, whether its pod was ever Ready, and since when it has not been after having been."""

# The Job controller's words for a podFailurePolicy match on an exit code (k8s >= 1.26).
_EXIT_CODE = re.compile(r"failed with exit code (\d+)")
# What a few launcher exit codes mean (128 + signal: the kernel or the kubelet ended the process).
_SIGNALS = {137: "SIGKILL: out of memory, or killed", 143: "SIGTERM", 139: "SIGSEGV"}


def start(now: float) -> Seen:
    return Seen(started=now, job_seen=False, was_ready=False, unready_since=None)


def _status(job: dict) -> dict:
    return job.get("status") or {}


def _ready(job: dict) -> bool:
    """The launcher pod runs (``status.ready``, k8s >= 1.24; else ``active``, which counts Pending pods too)."""
    status = _status(job)
    return bool(status.get("ready") if "ready" in status else status.get("active"))


def terminal_condition(job: dict) -> dict | None:
    """The Job's verdict: Complete / Failed, or FailureTarget (k8s >= 1.31 sets Failed only once the
    pod is gone; a pod stuck on a lost node would hold it back)."""
    for cond in _status(job).get("conditions") or ():
        if cond.get("status") == "True" and cond.get("type") in (
            "Complete",
            "SuccessCriteriaMet",
            "Failed",
            "FailureTarget",
        ):
            return cond
    return None


def observe(seen: Seen, job: dict | None, now: float) -> Seen:
    """Fold one reading of the launcher Job (None: not found) into what was seen."""
    if job is None:
        return seen
    if _ready(job):
        return seen._replace(job_seen=True, was_ready=True, unready_since=None)
    if seen.was_ready and seen.unready_since is None and terminal_condition(job) is None:
        return seen._replace(job_seen=True, unready_since=now)
    return seen._replace(job_seen=True)


def judge(
    seen: Seen, job: dict | None, now: float, *, name: str, start_bound: float, lost_bound: float
) -> Ending | None:
    """Has the launcher ended (or can it no longer run)? None while it may still run.

    ``start_bound``: seconds the launcher pod may take to start (``--start-timeout`` + a margin);
    ``lost_bound``: seconds a launcher pod that ran may stay not Ready without ending (``--orphan-timeout``).
    """
    if job is None:
        if seen.job_seen:
            return Ending(EXIT_WORKER_LOST, f"the launcher Job {name} was deleted", False)
        if now - seen.started >= start_bound:
            return Ending(
                EXIT_ALLOCATION,
                f"the launcher Job {name} was not created within {start_bound:g}s "
                "(the submitting mpilaunch stopped before it created it)",
                False,
            )
        return None
    cond = terminal_condition(job)
    if cond is not None:
        return from_condition(cond, name)
    if seen.unready_since is not None and now - seen.unready_since >= lost_bound:
        doing = "is being deleted and has not ended" if _status(job).get("terminating") else "has not been Ready"
        return Ending(
            EXIT_WORKER_LOST,
            f"the launcher pod of Job {name} {doing} for {now - seen.unready_since:.0f}s "
            f"(--orphan-timeout {lost_bound:g}s): its node is likely lost",
            True,
        )
    if not seen.was_ready and now - seen.started >= start_bound:
        within = f"within {start_bound:g}s (--start-timeout + 30s)"
        if _status(job).get("active"):
            why = f"the launcher pod of Job {name} did not start {within}: it cannot be scheduled, or its image pulled"
        else:
            why = (
                f"the launcher Job {name} got no pod {within}: the cluster refused to create one "
                "(a ResourceQuota, a LimitRange, an admission webhook: see the Job's events)"
            )
        return Ending(EXIT_ALLOCATION, why, True)
    return None


def from_condition(cond: dict, name: str) -> Ending:
    """The Job controller's verdict as the job's ending."""
    reason, message = cond.get("reason") or "", (cond.get("message") or "").strip()
    if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
        return Ending(0, None, False)
    said = f"Job {name}: {reason}: {message}" if message else f"Job {name}: {reason or 'failed'}"
    if reason == "DeadlineExceeded":
        return Ending(
            EXIT_TIMEOUT,
            "the job ran past its cluster-side deadline (--start-timeout + --timeout + "
            f"30s) and the Job controller stopped its launcher ({said})",
            False,
        )
    if reason == "PodFailurePolicy" and "DisruptionTarget" in message:
        return Ending(
            EXIT_WORKER_LOST,
            f"the launcher pod was disrupted (evicted, preempted, or its node drained or lost) ({said})",
            False,
        )
    code = _EXIT_CODE.search(message) if reason == "PodFailurePolicy" else None
    if code is not None:
        exit_code = int(code.group(1))
        meaning = f" ({_SIGNALS[exit_code]})" if exit_code in _SIGNALS else ""
        return Ending(exit_code, f"the launcher container ended with exit code {exit_code}{meaning} ({said})", False)
    return Ending(EXIT_WORKER_LOST, f"the launcher pod failed or was deleted ({said})", False)


def recorded_failure(ending: Ending) -> str | None:
    """The failure line the reaper records: what happened, and that the launcher could not say it itself."""
    if ending.failure is None:
        return None
    return f"{ending.failure}; the launcher recorded no outcome, so the job's reaper released its workers"
