"""The job's objects in the cluster: their creation, root first, in stages, and what the root tells.

The root ConfigMap owns every other object (ownerReferences), so deleting it
garbage-collects the job; the backend notes each object on its ``created`` as it is
made, and ``root_uid`` / ``root_sent`` say whether a root exists or may exist (a create
whose answer was lost), so that ``release`` deletes exactly what this process made.
Before anything, admission is asked about the job's pods (``dryRun=All``).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ...core import phases
from ...core.errors import AllocationError, UsageError
from . import orphan
from .admission import WORKLOADS
from .api import ApiError, creation_hint

# The order the job's objects are created in, after the root that owns them: each stage's
# objects at once, one stage after the other. What pods mount or use (tools, Secrets, RBAC,
# Service) comes before them; the reaper before any worker or launcher, so that from the first
# pod on, a job is reaped if this process dies (the Lease is in the first stage). Three round
# trips instead of one per kind put the workers on the way 0.2-0.3 s sooner on a loaded API server.
CREATION_STAGES = (("tools", "lease", "reaper-rbac", "setup"), ("reaper",), ("workers", "launcher"))
# On the root ConfigMap: which mpilaunch process created it (a random value, not a secret), so that
# a root whose create raised on this side but succeeded on the server is found and deleted.
CREATOR_ANNOTATION = "mpilaunch/creator"
# How long a create waits for an object of the same name left by an earlier job of the same name,
# which the garbage collector is removing (a rerun right after Ctrl-C, or after the reaper ended
# the job: the old root is gone, its pods still in their grace period).
EARLIER_JOB_WAIT_S = 60.0
THIS_JOB, EARLIER_JOB, NOT_A_JOB = "this job", "an earlier job", "not a job"


def whose(existing: dict, job: str, root_uid: str) -> str:
    """Whose is the object a create ran into (409)? ``THIS_JOB``: owned by this job's root (the
    client sent the create again on a new connection after the first answer was lost);
    ``EARLIER_JOB``: owned by another root ConfigMap named ``job`` (a job of the same name that
    was deleted: the garbage collector removes it); ``NOT_A_JOB``: anything else, not ours to wait
    for or touch."""
    owners = (existing.get("metadata") or {}).get("ownerReferences") or []
    roots = [o.get("uid") for o in owners if o.get("kind") == "ConfigMap" and o.get("name") == job]
    if root_uid in roots:
        return THIS_JOB
    return EARLIER_JOB if roots else NOT_A_JOB


def refusal_line(e: ApiError) -> str:
    """What refused an object: the namespace's policy by name (quota, LimitRange, PodSecurity), else
    the API server's own message."""
    from .refusals import explain

    policy = explain(e.message)
    return policy[0] if policy is not None else e.message


def create_objects(backend, objects: list[tuple[str, dict]]) -> None:
    """Create ``objects`` (the root first, the others owned by it, stage by stage), noting each on the
    backend's ``created`` as it is made, so that ``release`` deletes what exists on any exit path."""
    api = backend.api
    root = objects[0][1]
    # which root is this process's, should the create's answer be lost (root_sent)
    root["metadata"].setdefault("annotations", {})[CREATOR_ANNOTATION] = backend.creator
    backend.root_sent = True
    try:
        made = api.create(root)
    except ApiError as e:
        # 409: another job's, or this one's (the client sent the create again on a new connection
        # after the first one's answer was lost); 4xx: refused, nothing stored; 5xx: it may be
        made = None
        if e.status == 409:
            try:
                made = own_root(backend)
            except (ApiError, OSError):
                pass  # release() looks again
        backend.root_sent = made is None and (e.status >= 500 or e.status == 409)
        if made is None and e.status == 409:
            raise UsageError(
                f"a job named {backend.job} already exists in namespace {backend.namespace}",
                f"choose another --name, or, if it is an mpilaunch job of yours, remove it with: mpilaunch delete {backend.job} --backend k8s",
            ) from None
        if made is None:
            raise AllocationError(
                f"cannot create ConfigMap {backend.job}: {refusal_line(e)}", creation_hint(e)
            ) from None
    backend.root_sent = False
    backend.root_uid = made["metadata"]["uid"]
    backend.created.append(("v1", "configmaps", backend.job))
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": backend.job, "uid": backend.root_uid}

    def create(obj: dict) -> None:
        obj["metadata"]["ownerReferences"] = [owner]
        api_version, kind = obj["apiVersion"], obj["kind"]
        from .api import PLURALS

        if kind == "Lease":
            orphan.stamp_lease(obj, time.time())
        try:
            try:
                api.create(obj)
            except ApiError as e:
                if e.status != 409:
                    raise
                create_past_a_conflict(backend, obj, PLURALS[kind])
        except ApiError as e:
            if e.status == 404 and kind == "PodGroup":
                raise UsageError(
                    f"--gang {backend.opts.gang}: the PodGroup API ({api_version}) is not installed in this cluster",
                    "install the scheduler's CRDs, or use --gang none",
                ) from None
            raise AllocationError(
                f"cannot create {kind} {obj['metadata']['name']}: {refusal_line(e)}", creation_hint(e)
            ) from None
        backend.created.append((api_version, PLURALS[kind], obj["metadata"]["name"]))

    # one pool for every stage: its threads keep their connections to the API server, so the
    # later stages do not pay a TLS handshake per thread again
    with ThreadPoolExecutor(max_workers=8) as pool:
        for stage in CREATION_STAGES:
            batch = [obj for g, obj in objects if g in stage]
            for future in [pool.submit(create, obj) for obj in batch]:
                future.result()
            if "lease" in stage:
                backend.heartbeat = orphan.start_heartbeat(api, backend.job, backend.spec.orphan_timeout)
            if "workers" in stage:  # every worker pod created (the API server took them)
                for w in backend.plan.workers:
                    phases.mark_worker(backend.worker_times, w.name, "created")
            if "workers" in stage and backend.opts.queue:  # Kueue made a Workload of them: released first
                backend.created.append((*WORKLOADS, backend.job))


def create_past_a_conflict(backend, obj: dict, plural: str, clock=time.monotonic, sleep=time.sleep) -> None:
    """A create ran into an object of the same name: return once ``obj`` exists as this job's (it
    already was, or the earlier job's object went and ``obj`` was created again). An earlier job's
    that outstays ``EARLIER_JOB_WAIT_S`` is an allocation error; one that is no job's a usage
    error (exit 2): never waited for, never touched."""
    name, kind = obj["metadata"]["name"], obj["kind"]
    api_version = obj["apiVersion"]
    deadline, said = clock() + EARLIER_JOB_WAIT_S, False
    while True:
        try:
            existing = backend.api.get(api_version, plural, name)
        except ApiError as e:
            if e.status != 404:
                raise
            try:
                backend.api.create(obj)
                return
            except ApiError as again:
                if again.status != 409:
                    raise
                continue  # taken again in between: look at whose it is now
        owner = whose(existing, backend.job, backend.root_uid)
        if owner == THIS_JOB:
            return
        if owner == NOT_A_JOB:
            raise UsageError(
                f"{kind} {name} already exists in namespace {backend.namespace} and is not mpilaunch job "
                f"{backend.job}'s",
                "choose another --name (mpilaunch names the job's objects after it)",
            )
        if clock() >= deadline:
            raise AllocationError(
                f"{kind} {name} of an earlier job named {backend.job} is still being deleted after "
                f"{EARLIER_JOB_WAIT_S:g}s",
                f"remove it with: kubectl delete {plural} {name}, or choose another --name",
            )
        if not said:
            print(
                f"mpilaunch: waiting for {kind} {name} of an earlier job named {backend.job} to be deleted",
                file=sys.stderr,
                flush=True,
            )
            said = True
        sleep(0.25)


def own_root(backend) -> dict | None:
    """The job's root as the API server has it if this process created it (CREATOR_ANNOTATION), else
    None; an error reading it is raised."""
    try:
        root = backend.api.get("v1", "configmaps", backend.job)
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    mine = (root["metadata"].get("annotations") or {}).get(CREATOR_ANNOTATION) == backend.creator
    return root if mine else None


def root_made_unanswered(backend) -> str | None:
    """The uid of the root this process created though its create raised, None when there is none.

    Nothing else of the job exists then (no Lease, no reaper), so nothing else would ever delete it."""
    backend.root_sent = False
    try:
        root = own_root(backend)
        return root["metadata"]["uid"] if root else None
    except ApiError as e:
        error = e.message
    except OSError as e:
        error = str(e)
    print(
        f"mpilaunch: warning: cannot tell whether ConfigMap {backend.job} was created ({error}); "
        f"if it was, remove it with: mpilaunch delete {backend.job} --backend k8s",
        file=sys.stderr,
    )
    return None


# ------------------------------------------------------------ manage (manage.py)


def admission_check(backend, objects) -> None:
    """Ask admission about the job's pods before creating anything (``dryRun=All``): a PodSecurity
    refusal is a usage error (exit 2: what to pass), a quota or LimitRange one an allocation
    error (exit 3); both name the policy. Anything else is left to the creation itbackend."""
    from .refusals import dry_run_pods, explain

    def ask(pod: dict) -> tuple[dict, str | None]:
        try:
            backend.api.create(pod, dryRun="All")
        except ApiError as e:
            return pod, e.message if e.status in (403, 422) else None
        except OSError:
            pass
        return pod, None

    pods = dry_run_pods(objects)
    with ThreadPoolExecutor(max_workers=len(pods) or 1) as pool:  # one round trip, not three
        answers = list(pool.map(ask, pods))
    for pod, message in answers:
        policy = explain(message) if message else None
        if policy is None:
            continue
        line = f"cannot create pod {pod['metadata']['name']}: {policy[0]}"
        if "PodSecurity" in policy[0]:
            raise UsageError(line, policy[1] + "; nothing was created")
        raise AllocationError(line, policy[1] + "; nothing was created")
