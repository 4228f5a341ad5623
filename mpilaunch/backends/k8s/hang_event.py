"""The hang verdict as a Kubernetes Event on the job's launcher pod (worker 0's with --launcher local).

``kubectl describe pod`` and ``kubectl get events`` then show where the job
hung next to the pod's own events (issue 42). Type Warning, reason ``Hang``.
The submitting mpilaunch posts it for an attached job, with the user's
credentials; a detached job's launcher posts it on its own pod, whose name and
uid it has from the downward API (``POD_NAME``, ``POD_UID``): its Role grants
``create`` on events but no read of its own pod, whose name the Job controller
makes up (``k8s-rbac.yaml.j2``, ``rbac.RULES``).
"""

from __future__ import annotations

import time

from ..cluster_notes import ClusterNotes

# typing.TYPE_CHECKING without importing typing (the k8s backend imports this module on every launch)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

REASON = "Hang"
COMPONENT = "mpilaunch"
MESSAGE_MAX = 1024  # what an Event's message keeps (longer ones are refused or cut by the API server)


def hang_event(namespace: str, pod: dict, verdict: str, now: float | None = None, reason: str = REASON) -> dict:
    """The Event object for ``verdict`` about ``pod`` (the pod as the API returned it: name and uid);
    ``reason``: Hang, or Preflight for a worker that failed --preflight."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.{reason.lower()}-", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "type": "Warning",
        "message": verdict if len(verdict) <= MESSAGE_MAX else verdict[: MESSAGE_MAX - 3] + "...",
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post(api, namespace: str, pod_name: str, verdict: str, reason: str = REASON) -> None:
    """Create the Event (its pod read first for its uid: ``describe`` matches events by uid)."""
    pod = api.get("v1", "pods", pod_name, namespace=namespace)
    api.create(hang_event(namespace, pod, verdict, reason=reason))


def post_on_own_pod(api, namespace: str, environ, verdict: str) -> None:
    """Create the Event on the pod this runs in, named by the downward API (no read of the pod)."""
    pod = {"metadata": {"name": environ["POD_NAME"], "uid": environ["POD_UID"]}}
    api.create(hang_event(namespace, pod, verdict))


class PodEvents(ClusterNotes):
    """The submitting side's notes (``BaseBackend.cluster_notes``): Warning Events posted with the
    user's credentials. ``client``: the API client and the job's namespace, resolved when first
    used; ``hang_pod``: the pod the verdict goes on (the launcher's, worker 0's with --launcher
    local); ``pod_of``: the pod serving a worker (a spare's, after a swap)."""

    def __init__(self, client: Callable[[], tuple], hang_pod: Callable[[], str], pod_of: Callable[[str], str]):
        self.client, self.hang_pod, self.pod_of = client, hang_pod, pod_of

    def hang(self, verdict: str) -> bool:
        post(*self.client(), self.hang_pod(), verdict)
        return True

    def on_worker(self, worker: str, reason: str, text: str) -> bool:
        post(*self.client(), self.pod_of(worker), text, reason=reason)
        return True
