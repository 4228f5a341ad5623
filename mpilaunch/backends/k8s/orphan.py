"""Ownership in the cluster: the job's Lease, its renewal, and the reaper that deletes an orphaned job.

The root ConfigMap ``<job>`` owns every object of a job, so deleting it lets
the garbage collector remove the rest. The submitting mpilaunch renews a
``coordination.k8s.io/v1`` Lease ``<job>`` (owned by the root like the rest)
while it is attached. The reaper, ``python3 -m mpilaunch.backends.k8s.in_cluster.reaper``
in the pod of the Job ``<job>-reaper``, under a ServiceAccount that may only get
that Lease and delete that ConfigMap, deletes the root once the Lease has
not been renewed for ``--orphan-timeout`` or the job passed its
cluster-side deadline (``mpilaunch/core/orphan.py`` decides). A detached job has
no Lease: its reaper watches the launcher Job instead (``detached.py``).

Standard library only: the reaper runs this in the job's image.
"""

from __future__ import annotations

import math
import os
import time
from datetime import datetime, timezone
from typing import Callable

from ...core import orphan
from ..heartbeat import Heartbeat
from .api import Api, ApiError
from .credentials import CredentialError

LEASE_API = "coordination.k8s.io/v1"
# (creation group, template): the Lease, then the reaper's identity, then the reaper (the
# ServiceAccount must exist before a pod may use it)
TEMPLATES = (
    ("lease", "k8s-lease.yaml.j2"),
    ("reaper-rbac", "k8s-reaper.yaml.j2"),
    ("reaper", "k8s-reaper-job.yaml.j2"),
)


def templates_for(detach: bool) -> tuple:
    """A detached job has no heartbeat to renew, so no Lease; its reaper watches the launcher
    (``detached.py``) and, like an attached job's, is created before any worker."""
    return tuple(t for t in TEMPLATES if t[0] != "lease") if detach else TEMPLATES


def template_values(spec, job: str, reaper_labels: dict, reaper: Callable[[list[str]], list[str]]) -> dict:
    """What the Lease, the reaper and the deadline on pods and the launcher Job are rendered from.
    ``reaper``: the reaper's command for its arguments (``tools.reaper_command``)."""
    deadline_s = orphan.cluster_deadline_s(spec.start_timeout, spec.timeout)
    command = [job, "--orphan-timeout", f"{spec.orphan_timeout:g}"]
    if spec.detach:  # the launcher Job's own activeDeadlineSeconds carries the deadline
        from .launch import launcher_job_name  # here: the reaper, which imports this module, has no use for it

        start_bound = math.ceil(spec.start_timeout + orphan.DEADLINE_MARGIN_S)
        command += ["--launcher-job", launcher_job_name(job), "--start-bound", str(start_bound)]
    elif deadline_s:
        command += ["--deadline", str(deadline_s)]
    return {
        "deadline_s": deadline_s,
        "lease_holder": f"mpilaunch@{os.uname().nodename}:{os.getpid()}",
        "orphan_timeout_s": int(-(-spec.orphan_timeout // 1)),
        "reaper_name": f"{job}-reaper",
        "reaper_labels": reaper_labels,
        "reaper_command": reaper(command),
    }


def micro_time(t: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stamp_lease(obj: dict, now: float) -> None:
    """A new Lease is acquired and renewed at creation (its times cannot live in a template)."""
    obj["spec"]["acquireTime"] = obj["spec"]["renewTime"] = micro_time(now)


def start_heartbeat(api: Api, job: str, orphan_timeout: float) -> Heartbeat:
    """Renew the job's Lease from this process until stopped, or until the Lease is gone."""

    def renew() -> bool:
        try:
            api.patch(LEASE_API, "leases", job, {"spec": {"renewTime": micro_time(time.time())}})
        except ApiError as e:
            if e.status == 404:
                return False  # the job was deleted (mpilaunch delete, or reaped): nothing to keep alive
            raise
        return True

    return Heartbeat(renew, orphan_timeout, f"the job's Lease {job}", name=f"lease-{job}").start()


def reap(
    api: Api,
    job: str,
    orphan_timeout: float,
    deadline_s: float | None,
    *,
    log: Callable[[str], None],
    clock=time.monotonic,
    sleep=time.sleep,
) -> str | None:
    """Watch the Lease; delete the job's root when ``orphan.judge`` says so.

    Returns why the job was deleted, or None when it went away by itself
    (the submitting side deleted it: its Lease is gone).
    """
    started = clock()
    deadline = None if deadline_s is None else started + deadline_s
    seen = None
    interval = orphan.poll_interval(orphan_timeout)
    while True:
        asked = clock()
        try:
            lease = api.get(LEASE_API, "leases", job)
        except ApiError as e:
            if e.status == 404:
                return None
            log(f"cannot read Lease {job} ({e.status} {e.message[:200]}); retrying")
            lease = None
        except OSError as e:
            log(f"cannot reach the API server ({e}); retrying")
            lease = None
        except CredentialError as e:  # a token being rotated, or the job's ServiceAccount going with the job
            log(f"{e.message}; retrying")
            lease = None
        if lease is None:
            # No verdict, and no silence: the time until the next good read is not counted (an
            # API server that is down or being upgraded is not a dead mpilaunch; its renewals
            # could not land either).
            seen = orphan.unread(seen)
        else:
            now = clock()
            seen = orphan.observe(seen, (lease.get("spec") or {}).get("renewTime"), now, asked)
            verdict = orphan.judge(seen, now, orphan_timeout, deadline)
            if verdict.end:
                delete_root(api, job, lease)
                return verdict.reason
        sleep(interval)


def delete_root(api: Api, job: str, lease: dict) -> None:
    """Delete the root ConfigMap the Lease belongs to (its uid, not just its name: never a newer job's)."""
    owners = (lease.get("metadata") or {}).get("ownerReferences") or []
    uid = next((o.get("uid") for o in owners if o.get("kind") == "ConfigMap" and o.get("name") == job), None)
    body = {"propagationPolicy": "Background"}
    if uid:
        body["preconditions"] = {"uid": uid}
    try:
        api.delete("v1", "configmaps", job, **body)
    except ApiError as e:
        if e.status != 409:  # 409: a precondition failed, the root is another job's now
            raise
