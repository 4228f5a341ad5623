"""--spares on Kubernetes: spare worker pods beside the job's, and a swap that waits for no scheduler.

A spare is a worker pod of its own name (``<job>-spare-<i>``: its own host name,
its own DNS name under the job's headless Service, its own ``MPILAUNCH_WORKER``
for its agent), made from the workers' manifest and not in the hostfile. It is
created after the workers and never waited for: a spare the namespace refuses
or the scheduler cannot place costs the job nothing (a warning), it just is not
there to swap in. A swap deletes the replaced pod, lets the spare serve the
worker's slot (``spare_pool.py``: the shims reach it, the ranks say the
worker's name) and asks for another spare; a pod that scheduling, image pull
and container start keep from a relaunch for seconds (minutes on a busy
cluster) is ready at once.

mpirun runs on this machine (``--launcher local``): the in-cluster launcher and
a gang or queue (whose group counts its pods) are refused for now.
"""

from __future__ import annotations

import copy
import sys

from ...core import env_names
from ...core.errors import UsageError
from ..spare_pool import SPARE_KEY
from . import startup
from .api import ApiError
from .pods import pod_loss, pod_ready


def check(spec, launcher: str, opts) -> None:
    """--spares where this backend cannot keep them: one line, exit 2, before anything is created."""
    if not spec.spares:
        return
    if launcher == "cluster":
        raise UsageError(
            "--spares needs mpirun on this machine (--launcher local) on Kubernetes",
            "add --launcher local, or drop --spares (--retries still replaces a lost worker pod)",
        )
    if opts.gang != "none" or opts.queue:
        raise UsageError(
            "--spares cannot be used with --gang or --queue yet: the group counts the job's pods",
            "drop --spares, or --gang/--queue",
        )


def renamed(worker_pod: dict, name: str) -> dict:
    """The worker pod manifest ``worker_pod`` as the pod ``name``: its name, host name and the
    ``MPILAUNCH_WORKER`` its agent calls itself by (pure)."""
    obj = copy.deepcopy(worker_pod)
    old = obj["metadata"]["name"]
    obj["metadata"]["name"] = name
    for key in ("uid", "resourceVersion", "ownerReferences", "creationTimestamp"):
        obj["metadata"].pop(key, None)
    obj.pop("status", None)
    spec = obj["spec"]
    if spec.get("hostname") == old:
        spec["hostname"] = name
    for container in spec.get("containers") or ():
        for env in container.get("env") or ():
            if env.get("name") == env_names.WORKER:
                env["value"] = name
    return obj


def template_pod(objects: list[tuple[str, dict]], plan) -> dict:
    """The worker manifest a spare is made from: the largest worker's (a spare may serve any)."""
    largest = max(plan.workers, key=lambda w: (w.gpus, w.slots)).name
    return next(obj for group, obj in objects if group == "workers" and obj["metadata"]["name"] == largest)


def ask(backend, count: int) -> None:
    """Create ``count`` spare pods (owned by the root, as the workers); a refused one is a warning."""
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": backend.job, "uid": backend.root_uid}
    for _ in range(count):
        name = backend.spares.new_spare().name
        obj = renamed(backend.spare_template, name)
        obj["metadata"]["ownerReferences"] = [owner]
        try:
            backend.api.create(obj)
        except (ApiError, OSError) as e:
            said = getattr(e, "message", None) or str(e)
            print(
                f"mpilaunch: warning: spare pod {name} not created ({said}); the job runs without it", file=sys.stderr
            )
            continue
        backend.created.append(("v1", "pods", name))
        backend.spare_pods.append(name)


def waiting(backend) -> int:
    """Look at the spare pods once: a Ready one waits for a worker's place, a lost one is no spare."""
    if not backend.spare_pods:
        return 0
    try:
        pods = {p["metadata"]["name"]: p for p in startup.list_pods(backend.api, backend.job)}
    except (ApiError, OSError):
        return len(backend.spares.waiting)  # no answer now: what was seen last
    for name in backend.spare_pods:
        pod = pods.get(name)
        if pod is not None and pod_ready(pod) and pod_loss(pod) is None:
            backend.pods[name] = pod
            backend.spares.ready(name)
        else:
            backend.spares.lost(name)
    return len(backend.spares.waiting)


def swap(backend, names: list[str], why: str, recreate) -> dict[str, str]:
    """A Ready spare serves each of ``names`` (the pod that served it deleted, another spare asked
    for); ``recreate(names)`` for those no spare waits for. Returns worker -> spare."""
    waiting(backend)
    taken, rest = {}, []
    for name in names:
        before = backend.member(name)
        spare = backend.spares.take(name, why)
        if spare is None:
            backend.spares.serving.pop(name, None)
            rest.append(name)
        else:
            backend.spare_pods.remove(spare)
            taken[name] = spare
        if before != name or spare is not None:  # recreate() deletes a pod of the worker's own name
            delete_pod(backend, before)
    if rest:
        recreate(rest)
    ask(backend, len(taken))
    return taken


def delete_pod(backend, name: str) -> None:
    backend.pods.pop(name, None)
    try:
        backend.api.delete("v1", "pods", name, gracePeriodSeconds=0)
    except (ApiError, OSError):
        pass  # gone already, or left to release (it deletes every pod of the job)


def context_entries(backend, workers: dict) -> dict:
    """``workers`` (the context's, by the plan's names) with the spare serving each, where one does."""
    return {
        name: {**entry, SPARE_KEY: backend.spares.serving[name]} if name in backend.spares.serving else entry
        for name, entry in workers.items()
    }
