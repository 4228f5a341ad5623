"""The hang verdict as a Kubernetes Event on the job's launcher pod (worker 0's with --launcher local).

``kubectl describe pod`` and ``kubectl get events`` then show where the job
hung next to the pod's own events (issue 42). Type Warning, reason ``Hang``;
the Role every job's launcher has allows ``create`` on events (``rbac.RULES``).
"""

from __future__ import annotations

import time

REASON = "Hang"
COMPONENT = "mpilaunch"
MESSAGE_MAX = 1024  # what an Event's message keeps (longer ones are refused or cut by the API server)


def hang_event(namespace: str, pod: dict, verdict: str, now: float | None = None) -> dict:
    """The Event object for ``verdict`` about ``pod`` (the pod as the API returned it: name and uid)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.hang-", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "reason": REASON,
        "type": "Warning",
        "message": verdict if len(verdict) <= MESSAGE_MAX else verdict[: MESSAGE_MAX - 3] + "...",
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post(api, namespace: str, pod_name: str, verdict: str) -> None:
    """Create the Event (its pod read first for its uid: ``describe`` matches events by uid)."""
    pod = api.get("v1", "pods", pod_name, namespace=namespace)
    api.create(hang_event(namespace, pod, verdict))
