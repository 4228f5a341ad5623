"""What a pod's status says: ready, why not, how its launcher container ended.

Pure functions of the API's pod objects, shared by the backend's wait and
watch and by the management commands.
"""

from __future__ import annotations

from ...core import launcher_lines
from ...core.exit_codes import EXIT_FAILED
from .admission import KUEUE_EVICTED, evicted_by_kueue

JOB_LABEL = "mpilaunch/job"
ROLE_LABEL = "mpilaunch/role"
WORKER_CONTAINER = "worker"
LAUNCHER_CONTAINER = "launcher"
# Where a detached job's launcher records the outcome, in the job's root ConfigMap.
RESULT_KEY = "result.json"

FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}

# How often the wait for a job's pods asks the API server again. A small job's pods are Ready
# 1-2 s after they are created (a node with the image), so a 0.5 s poll made the launch wait
# 0.25 s on average for nothing; kubectl wait watches instead. Often while the pods are few and
# the wait is young, the usual pace past that (a list of many pods is a load of its own).
FAST_POLL_S, SLOW_POLL_S = 0.1, 0.5
FAST_POLL_PODS, FAST_POLL_FOR_S = 16, 10.0


def ready_poll_s(waited_s: float, pods: int) -> float:
    """Seconds until the next look at ``pods`` pods not all Ready after ``waited_s`` of waiting."""
    return FAST_POLL_S if pods <= FAST_POLL_PODS and waited_s < FAST_POLL_FOR_S else SLOW_POLL_S


def pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def pod_problem(pod: dict) -> tuple[str | None, bool]:
    """Why a pod is not ready: ``(message, fatal)``."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or phase
        return f"pod {phase.lower()} ({reason}: {status.get('message') or 'no message'})", True
    for cs in status.get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return f"{waiting['reason']}: {waiting.get('message') or cs.get('image')}", True
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated:
            said = (terminated.get("message") or "").strip()
            return (
                f"container exited with {terminated.get('exitCode')} ({terminated.get('reason')})"
                + (f": {said}" if said else "")
            ), True
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return (cond.get("message") or cond.get("reason") or "not scheduled").strip(), False
    if not status.get("conditions"):
        return "not scheduled yet", False
    return f"{phase or 'Pending'}, not Ready", False


def unschedulable_note(pods: list[dict]) -> str | None:
    """The scheduler's reason for the pods it cannot place, for the progress line as soon as it
    says it (it was shown only in the error at --start-timeout): "16 Unschedulable: 0/16 nodes
    are available: 16 Insufficient nvidia.com/gpu." (the first such pod's message)."""
    said = [
        (cond.get("message") or "no node fits").strip()
        for pod in pods
        for cond in (pod.get("status") or {}).get("conditions") or ()
        if cond.get("type") == "PodScheduled"
        and cond.get("status") == "False"
        and cond.get("reason") == "Unschedulable"
    ]
    if not said:
        return None
    message = said[0] if len(said[0]) <= 200 else said[0][:199] + "…"
    return f"{len(said)} Unschedulable: {message}"


def launcher_placement_hint(problem: str | None) -> str:
    """The start of a hint for a launcher pod the scheduler placed nowhere: it does not take the
    workers' node selector and tolerations, so where every node is tainted it needs its own."""
    if problem and ("untolerated taint" in problem or "node affinity/selector" in problem):
        return (
            "the launcher and reaper take no node selector or toleration of the workers': give them "
            "--launcher-node-selector/--launcher-toleration; "
        )
    return ""


def launcher_started(pod: dict) -> bool:
    """The launcher pod's container got to run (it may already have ended: its result says how).

    The container's terminated state can reach the API server before the
    pod's phase leaves Running, so a launcher that finished quickly (a
    --retries attempt that succeeds at once) looks like "container exited"
    for a moment; that is a launcher that ran, not one that cannot start.
    """
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any({"running", "terminated"} & set(cs.get("state") or {}) for cs in status.get("containerStatuses") or ())


def pod_loss(pod: dict | None) -> str | None:
    """Why a worker pod that was running is gone, in the cluster's words; None while it still serves.

    Only what the API server states counts (deleted, terminating, evicted,
    failed, the worker container ended), so a slow answer is never a loss.
    """
    if pod is None:
        return "pod deleted"
    status = pod.get("status") or {}
    # why the cluster is ending it: eviction (API or node pressure), preemption, taints; Kueue
    # says TerminationTarget when it stops an evicted Workload's pods
    disruption = next(
        (
            c
            for c in status.get("conditions") or ()
            if c.get("type") in ("DisruptionTarget", "TerminationTarget") and c.get("status") == "True"
        ),
        None,
    )
    if disruption is not None:
        reason, said = disruption.get("reason") or "disrupted", disruption.get("message") or "no message"
        if reason.startswith(KUEUE_EVICTED):  # e.g. WorkloadEvictedDueToPreempted
            return evicted_by_kueue(reason, said)
        return f"{reason}: {said}".strip()
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "pod deleted (terminating)"
    if status.get("reason") == "Evicted":
        return f"Evicted: {status.get('message') or 'no message'}".strip()
    for cs in status.get("containerStatuses") or ():
        terminated = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == WORKER_CONTAINER and terminated:
            reason = terminated.get("reason") or "container ended"
            return f"{reason} (exit {terminated.get('exitCode')})"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"pod {status['phase'].lower()}: {status.get('reason') or status.get('message') or 'no reason given'}"
    return None


# The launcher pod's line just before it starts mpirun (launcher.py):
# when the submitting side sees it, mpirun is starting in the cluster.
LAUNCHER_READY = "mpilaunch: launcher: "
# The launcher's last line when attached: its exit code, signed with the launch's token as the
# rank wrappers' lines are. The submitting side ends on it at once instead of waiting for the
# kubelet to report the container's exit (~1-1.5 s: its status sync after the next relist).
LAUNCHER_DONE = "mpilaunch: launcher: done exit="
# the launcher's own verdicts on the workers (--preflight, --straggler-report) and its errors
LAUNCHER_NOTES = launcher_lines.NOTES
# a spare it swapped in itself (--retries with --spares): the submitting side's bookkeeping
LAUNCHER_SWAP = launcher_lines.SWAP_PREFIX


def parse_launcher_done(text: str, token: str | None) -> int | None:
    """The exit code of a ``LAUNCHER_DONE`` line carrying ``token``; None for any other line."""
    if not text.startswith(LAUNCHER_DONE):
        return None
    code, _, signed = text[len(LAUNCHER_DONE) :].strip().partition(" token=")
    if not code.lstrip("-").isdigit() or (token and signed != token):
        return None
    return int(code)


def startup_phases(pods: list[dict], expected: int) -> list[str]:
    """The start-up phases (``phases.py``) every one of ``expected`` pods has reached:
    ``pods_scheduled`` (bound to a node), ``containers_running`` (phase Running)."""
    if len(pods) < expected:
        return []
    reached = []
    if all((p.get("spec") or {}).get("nodeName") for p in pods):
        reached.append("pods_scheduled")
    if all((p.get("status") or {}).get("phase") == "Running" for p in pods):
        reached.append("containers_running")
    return reached


def pod_phases(pod: dict | None) -> list[str]:
    """One worker pod's start-up phases reached (report.json's ``timings.workers``): ``created``
    (it exists), ``scheduled`` (bound to a node), ``running`` (phase Running: the image pulled and
    the container started), ``ready`` (its readiness condition: the agent or exec answers)."""
    if pod is None:
        return []
    reached = ["created"]
    if (pod.get("spec") or {}).get("nodeName"):
        reached.append("scheduled")
    if (pod.get("status") or {}).get("phase") == "Running":
        reached.append("running")
    if pod_ready(pod):
        reached.append("ready")
    return reached


def summarize(problems: dict[str, str], limit: int = 3) -> str:
    """Group identical reasons: ``12 pods: <reason> (a, b, c, ...)``."""
    groups: dict[str, list[str]] = {}
    for pod, reason in problems.items():
        groups.setdefault(reason, []).append(pod)
    parts = []
    for reason, pods in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(sorted(pods)[:limit]) + (", ..." if len(pods) > limit else "")
        parts.append(f"{len(pods)} pod{'s' if len(pods) != 1 else ''} ({shown}): {reason}")
    return "; ".join(parts)


def launcher_exit(pod: dict) -> int | None:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or ():
        if cs.get("name") == LAUNCHER_CONTAINER:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated is not None:
                return int(terminated.get("exitCode", EXIT_FAILED))
    phase = status.get("phase")
    if phase == "Succeeded":
        return 0
    if phase == "Failed":
        return EXIT_FAILED
    return None


def pod_description(pod: dict | None, name: str, namespace: str, gpus: int) -> dict:
    """What the record keeps of the pod ``name`` serving a worker of ``gpus`` GPUs (report.json's
    workers: its node, IP and phase, the image run and its digest for ``record.images_of``)."""
    pod = pod or {}
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return {
        "pod": name,
        "namespace": namespace,
        "node": spec.get("nodeName"),
        "pod_ip": status.get("podIP"),
        "phase": status.get("phase"),
        "gpus": gpus,
        "image": next(iter(spec.get("containers") or []), {}).get("image"),
        "image_id": next(iter(status.get("containerStatuses") or []), {}).get("imageID"),
    }
