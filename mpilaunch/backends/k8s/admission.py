"""Who decides when a job's pods may start, besides the scheduler: a gang's PodGroup, Kueue's Workload.

What makes a pod a member (labels, annotations, the scheduler's name), and
what their status says while the job waits: the progress line, the
--start-timeout error and a preemption's reason are the scheduler's or
Kueue's own words. Pure functions on the objects, and one reader that fetches
them at most every few seconds (they change slowly; the pods are polled more
often).
"""

from __future__ import annotations

import time

from .api import ApiError

# --gang: the scheduler that places the job's pods, the PodGroup API it reads
SCHEDULERS = {"volcano": "volcano", "coscheduling": "scheduler-plugins-scheduler"}
PODGROUP_API = {"volcano": "scheduling.volcano.sh/v1beta1", "coscheduling": "scheduling.x-k8s.io/v1alpha1"}

# --queue: Kueue's plain-pod groups (pkg/controller/jobs/pod in Kueue)
KUEUE_API = "kueue.x-k8s.io/v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# A failed or deleted member ends the group (Kueue's default waits for a replacement pod, holding
# the quota and, through its finalizer, every deleted pod): however the job's pods go, they go.
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
WORKLOADS = (KUEUE_API, "workloads")
# the reason of the TerminationTarget condition Kueue puts on an evicted Workload's pods
KUEUE_EVICTED = "WorkloadEvictedDueTo"

READ_EVERY_S = 2.0


def gang_membership(gang: str, job: str) -> tuple[dict, dict]:
    """``(labels, annotations)`` that put a pod in the job's PodGroup (named like the job)."""
    if gang == "volcano":
        return {}, {"scheduling.k8s.io/group-name": job}
    if gang == "coscheduling":
        return {"scheduling.x-k8s.io/pod-group": job}, {}
    return {}, {}


def queue_membership(queue: str | None, job: str, pods: int) -> tuple[dict, dict]:
    """``(labels, annotations)`` of the pods Kueue admits as one group of ``pods`` (a Workload named like the job)."""
    if not queue:
        return {}, {}
    return {QUEUE_LABEL: queue, GROUP_LABEL: job}, {GROUP_COUNT_ANNOTATION: str(pods), RETRIABLE_ANNOTATION: "false"}


def _true_conditions(obj: dict | None) -> dict[str, dict]:
    return {
        c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or () if c.get("status") == "True"
    }


def podgroup_note(gang: str, podgroup: dict | None, warning: str | None = None) -> str | None:
    """Why the gang does not run yet, in its scheduler's words; None once it runs or while it says nothing.

    Volcano: the phase (Pending: its queue cannot hold minResources; Inqueue:
    admitted, waiting for room for minMember pods at once) and its
    Unschedulable condition's message, e.g. "3/3 tasks in gang unschedulable:
    pod group is not ready, 3 Pending, 3 minAvailable; Pending: 3
    Unschedulable", else ``warning``, the PodGroup's latest Warning event
    (e.g. "queue resource quota insufficient"). Coscheduling: the phase."""
    if podgroup is None:
        return None
    status = podgroup.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in ("Running", "Completed", "Finished", "Scheduled"):
        return None  # Volcano keeps a stale Unschedulable condition after it ran: the phase decides
    unschedulable = _true_conditions(podgroup).get("Unschedulable")
    said = ((unschedulable or {}).get("message") or "").strip() or (warning or "").strip()
    return f"gang not scheduled ({gang} PodGroup {phase})" + (f": {said}" if said else "")


NO_WORKLOAD_HINT_AFTER_S = 15.0  # Kueue makes one within a second of the pods: after this long, say why not


def workload_note(queue: str, workload: dict | None, local_queue: dict | None, waited: float = 0.0) -> str | None:
    """Why Kueue has not admitted the job, in its words; None once admitted.

    E.g. "queued in Kueue LocalQueue q (ClusterQueue cq, 2 pending): couldn't
    assign flavors to pod set ...: insufficient unused quota for nvidia.com/gpu
    in flavor gpu, 8 more needed"."""
    conditions = _true_conditions(workload)
    if "Admitted" in conditions:
        return None
    where = f"queued in Kueue LocalQueue {queue}"
    lq_status = (local_queue or {}).get("status") or {}
    facts = [f"ClusterQueue {(local_queue or {}).get('spec', {}).get('clusterQueue')}"] if local_queue else []
    if lq_status.get("pendingWorkloads"):  # Kueue updates it on its own schedule: a 0 while queued is stale
        facts.append(f"{lq_status['pendingWorkloads']} pending")
    if facts:
        where += f" ({', '.join(facts)})"
    if workload is None:
        if waited < NO_WORKLOAD_HINT_AFTER_S:
            return f"{where}: waiting for Kueue's Workload"
        return (
            f"{where}: Kueue made no Workload of the pods in {waited:.0f} s (is its pod integration on, "
            f"for this namespace?)"
        )
    said = ""
    for cond in (workload.get("status") or {}).get("conditions") or ():
        if cond.get("type") in ("QuotaReserved", "Admitted") and cond.get("status") == "False":
            said = (cond.get("message") or cond.get("reason") or "").strip()
            if said:
                break
    return f"{where}: {said}" if said else where


def workload_eviction(workload: dict | None) -> str | None:
    """Why Kueue took an admitted job's pods back (Evicted: preempted, its quota reclaimed...); None if it did not."""
    evicted = _true_conditions(workload).get("Evicted")
    if evicted is None:
        return None
    return evicted_by_kueue(evicted.get("reason") or "Evicted", evicted.get("message") or "")


def evicted_by_kueue(reason: str, message: str) -> str:
    """One wording for a Kueue eviction, read from the Workload or from a pod's TerminationTarget."""
    reason = reason[len(KUEUE_EVICTED) :] if reason.startswith(KUEUE_EVICTED) else reason
    said = message.strip()
    return f"evicted by Kueue ({reason}" + (f": {said})" if said else ")")


def release_workload(api, job: str) -> None:
    """Delete the job's Kueue Workload, if it is this job's: Kueue then lets its pods go at once.

    Deleting a running group's pods alone leaves them Terminating behind Kueue's finalizer
    (seen on the testbed: over 60 s, the quota held) until the pods end on their nodes."""
    try:
        workload = api.get(*WORKLOADS, job)
    except (ApiError, OSError, ValueError):
        return  # none, no Kueue, or not ours to read: nothing to release here
    owners = (workload.get("metadata") or {}).get("ownerReferences") or ()
    if any(o.get("kind") == "Pod" and o.get("name", "").startswith(f"{job}-worker-") for o in owners):
        try:
            api.delete(*WORKLOADS, job, propagationPolicy="Background")
        except (ApiError, OSError):
            pass  # the pods' own end releases it on a real cluster (RETRIABLE_ANNOTATION)


class AdmissionReader:
    """Reads the job's PodGroup and Workload (as the submitting user) at most every READ_EVERY_S."""

    def __init__(self, api, gang: str, queue: str | None, job: str):
        self.api, self.gang, self.queue, self.job = api, gang, queue, job
        self._read_at = 0.0
        self._first_read: float | None = None
        self._note: str | None = None

    @property
    def active(self) -> bool:
        return self.gang != "none" or bool(self.queue)

    def _get(self, api_version: str, plural: str, name: str) -> dict | None:
        try:
            return self.api.get(api_version, plural, name)
        except (ApiError, OSError, ValueError):
            return None  # not there (yet), or not readable: the note says less, the job goes on

    def note(self) -> str | None:
        """The current reason the job waits, or None (also when nothing is to be read)."""
        if not self.active:
            return None
        now = time.monotonic()
        if now - self._read_at < READ_EVERY_S:
            return self._note
        self._read_at = now
        if self._first_read is None:
            self._first_read = now
        notes = []
        if self.queue:
            workload = self._get(*WORKLOADS, self.job)
            local_queue = self._get(KUEUE_API, "localqueues", self.queue)
            notes.append(workload_note(self.queue, workload, local_queue, now - self._first_read))
        if self.gang != "none":
            podgroup = self._get(PODGROUP_API[self.gang], "podgroups", self.job)
            notes.append(podgroup_note(self.gang, podgroup, self._latest_warning("PodGroup") if podgroup else None))
        self._note = "; ".join(n for n in notes if n) or None
        return self._note

    def _latest_warning(self, kind: str) -> str | None:
        """The message of the job's object's latest Warning event."""
        try:
            events = self.api.get(
                "v1", "events", fieldSelector=f"involvedObject.name={self.job},involvedObject.kind={kind},type=Warning"
            )["items"]
        except (ApiError, OSError, ValueError):
            return None
        events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if not events:
            return None
        return (events[-1].get("message") or "").strip() or None

    def eviction(self) -> str | None:
        """Kueue's reason for evicting the admitted job (read now), or None."""
        if not self.queue:
            return None
        return workload_eviction(self._get(*WORKLOADS, self.job))
