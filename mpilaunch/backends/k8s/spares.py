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

With the in-cluster launcher the launcher pod swaps itself: its Role names every
spare pod it may take (``get``), its description names them and carries --retries
(``launch.relaunches``), and when a worker is lost (or ``--preflight enforce``
rejects one) and a spare is Ready, it runs mpirun again from the same pod, with no
new launcher pod to schedule and start, and tells this side in a signed line
(``taken_by_launcher``: the replaced pod deleted, a new spare asked for, the
ended attempt kept for the record). Without a spare waiting it ends as before
and this side relaunches: a new launcher pod, told which spare serves which
worker in ``MPILAUNCH_SERVING``. With ``--gang`` a spare, made from the
workers' manifest, is a member of the job's PodGroup beyond its minMember
(the worker count) and outside its minResources, asked for once the workers
are placed (``after_the_gang``): the gang scheduler placed the workers as one,
and places a spare when there is room, so a spare that cannot be placed never
holds the job back. ``--queue`` (Kueue admits a group of a fixed
count) and an administrator's ``--service-account`` (whose Role names no
spare) are refused.
"""

from __future__ import annotations

import copy
import json
import sys

from ...core import env_names
from ...core.errors import UsageError
from . import startup
from .api import ApiError
from .pods import pod_loss, pod_ready


def check(spec, placement, opts) -> None:
    """--spares where this backend cannot keep them: one line, exit 2, before anything is created."""
    if not spec.spares:
        return
    placement.check_spares(spec, opts)
    if opts.queue:
        raise UsageError(
            "--spares cannot be used with --queue: Kueue admits the job's pods as one group of a fixed "
            "count, so a spare would be held back with it, or hold it back",
            "drop --spares (--gang gives spares outside the group's minimum), or --queue",
        )


def after_the_gang(opts) -> bool:
    """With --gang the spares are asked for once the workers are placed: the gang scheduler binds any
    minMember of its group's pods, so a spare created with the workers could take a worker's place
    in a full cluster and hold the job back (seen under Volcano: 2 workers of 8 GPUs and a spare on
    16 GPUs; the spare and one worker bound, the other worker Pending, the job never ready)."""
    return opts.gang != "none"


def serving_env(backend) -> list[dict]:
    """A relaunched launcher pod's ``MPILAUNCH_SERVING``: which spare pod serves which worker."""
    return [{"name": env_names.SERVING, "value": json.dumps(backend.spares.serving)}] if backend.spares.serving else []


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
    """Create ``count`` spare pods (owned by the root, as the workers); a refused one is a warning,
    and so is one past what the launcher pod's Role names (``launcher_placement.PodLauncher.spare_names_for_role``)."""
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": backend.job, "uid": backend.root_uid}
    allowed = backend.launcher_placement.spare_names_for_role(backend)
    for _ in range(count):
        if allowed and backend.spares.asked >= len(allowed):
            return  # the launcher pod could not reach it
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


def coming(backend) -> int:
    """Spare pods made and still starting: not Ready yet, not lost (``ReplacesWorkers.spares_coming``)."""
    if not backend.spare_pods:
        return 0
    try:
        pods = {p["metadata"]["name"]: p for p in startup.list_pods(backend.api, backend.job)}
    except (ApiError, OSError):
        return 0
    return sum(
        1
        for name in backend.spare_pods
        if (pod := pods.get(name)) is not None and pod_loss(pod) is None and not pod_ready(pod)
    )


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


def taken_by_launcher(backend, swaps: list[dict]) -> list[dict]:
    """The launcher pod's own swaps (its signed line, ``launcher_lines.swap_line``), kept here too:
    the spare serves the worker, the pod that served it is deleted, a new spare is asked for. A
    swap that names a worker not of the plan or a pod this side did not make as a spare is left
    out (a warning): the launcher can only see the spares made here. Returns the swaps kept."""
    workers, kept = {w.name for w in backend.plan.workers}, []
    for entry in swaps:
        worker, spare = entry["worker"], entry["spare"]
        if worker not in workers or spare not in backend.spare_pods:
            print(
                f"mpilaunch: warning: the launcher pod swapped {spare} for {worker}, not a spare of this job; ignored"
            )
            continue
        before = backend.member(worker)
        backend.spare_pods.remove(spare)
        backend.spares.lost(spare)  # waits no more
        backend.spares.serving[worker] = spare
        try:
            backend.pods[spare] = backend.api.get("v1", "pods", spare)  # its node and IP, for the record
        except (ApiError, OSError):
            pass
        delete_pod(backend, before)
        kept.append(entry)
    ask(backend, len(kept))
    return kept


def delete_pod(backend, name: str) -> None:
    backend.pods.pop(name, None)
    try:
        backend.api.delete("v1", "pods", name, gracePeriodSeconds=0)
    except (ApiError, OSError):
        pass  # gone already, or left to release (it deletes every pod of the job)
