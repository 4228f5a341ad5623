"""--retries on Kubernetes: recreate lost worker pods and, with the cluster launcher, the launcher.

Both run on the submitting side, with the user's credentials: the job's
Role stays exec-only. A replaced object keeps its name and manifest (the
hostfile names the pods; the headless Service resolves them) and its owner
reference to the job's root ConfigMap, so deleting the root still removes
everything. The launcher Job is recreated for every relaunch, also after a
failed rank (``--retry-rank-failures``), its pod told the attempt number.
"""

from __future__ import annotations

import time

from ...core import env_names
from ...core.errors import AllocationError
from . import spares
from .api import PLURALS, ApiError

GONE_TIMEOUT_S = 60.0
POLL_S = 0.25


def recreate(backend, obj: dict, **delete_options) -> None:
    """Delete the object of that name (if anything is left of it), wait until the name is free, create ``obj``."""
    api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    plural = PLURALS[kind]
    backend.api.delete(api_version, plural, name, **delete_options)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while True:  # a name is free only once the old object is gone from the API
        try:
            backend.api.get(api_version, plural, name)
        except (ApiError, OSError) as e:
            if getattr(e, "status", None) == 404:
                break
        if time.monotonic() > deadline:
            raise AllocationError(
                f"{kind} {name} was not deleted within {GONE_TIMEOUT_S:g} s; cannot replace it",
                f"check its finalizers: kubectl get {plural} {name} -o yaml",
            )
        time.sleep(POLL_S)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": backend.job, "uid": backend.root_uid}
    ]
    try:
        backend.api.create(obj)
    except ApiError as e:
        raise AllocationError(
            f"cannot create the replacement {kind} {name}: {e.message}",
            "check the namespace's quota and your permissions",
        ) from None


def replace_workers(backend, names: list[str]) -> None:
    docs = {obj["metadata"]["name"]: obj for group, obj in backend.objects() if group == "workers"}
    for name in names:
        recreate(backend, docs[name], gracePeriodSeconds=0)
        backend.pods.pop(name, None)


def relaunch_launcher(backend, attempt: int) -> None:
    """A new launcher Job for attempt ``attempt``; ``wait_ready`` then waits for its pod."""
    (job,) = [obj for group, obj in backend.objects() if group == "launcher"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    container.setdefault("env", []).append({"name": env_names.ATTEMPT, "value": str(attempt)})
    container["env"] += spares.serving_env(backend)  # --spares: the spare pods now serving workers
    # Foreground: the Job is gone only once its pod is, so the new pod is the only launcher pod
    recreate(backend, job, propagationPolicy="Foreground", gracePeriodSeconds=0)
    backend.launcher_pod = None
