"""``mpilaunch status|logs|delete NAME --backend k8s``, and deleting a job's objects."""

from __future__ import annotations

import calendar
import json
import sys
import time

from ...core.errors import UsageError
from ...core.exit_codes import EXIT_TIMEOUT
from ...job import summary
from ..launch_description import LaunchDescription
from ..rendezvous import rank_python
from . import admission
from .api import Api, ApiError, client, resolve
from .launch import exec_api_context
from .pod_events import waiter
from .pods import (
    JOB_LABEL,
    LAUNCHER_CONTAINER,
    RESULT_KEY,
    ROLE_LABEL,
    WORKER_CONTAINER,
    launcher_exit,
    pod_ready,
    ready_poll_s,
)


def _manage_api(args) -> Api:
    return client(args.kubeconfig, args.context, args.namespace)


_LIST_HINT = f"list jobs with: kubectl get configmap -l {JOB_LABEL}"


def _root(api: Api, name: str) -> dict:
    """The job's root ConfigMap; a usage error if there is none, or if the
    ConfigMap of that name is not one mpilaunch made (someone else's: never
    to be reported on as a job, nor deleted)."""
    try:
        root = api.get("v1", "configmaps", name)
    except ApiError as e:
        if e.status == 404:
            raise UsageError(f"no job {name} in namespace {api.namespace}", _LIST_HINT) from None
        raise
    _check_ours(api, root, name)
    return root


def _check_ours(api: Api, root: dict, name: str) -> None:
    """Only a ConfigMap labelled ``mpilaunch/job=NAME`` (what k8s-root.yaml.j2 puts on it) is a job's root."""
    label = (root["metadata"].get("labels") or {}).get(JOB_LABEL)
    if label != name:
        has = f"its {JOB_LABEL} label is {label!r}" if label is not None else f"it has no {JOB_LABEL} label"
        raise UsageError(
            f"configmap {name} in namespace {api.namespace} is not an mpilaunch job ({has})",
            "mpilaunch looks at and deletes only the jobs it created; " + _LIST_HINT,
        )


def _seconds(timestamp: str | None) -> float | None:
    """An API timestamp (``2026-11-23T21:05:00Z``) as epoch seconds."""
    if not timestamp:
        return None
    return calendar.timegm(time.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ"))


def job_phase(root: dict, launcher: dict | None, now: float) -> tuple[str, int | None, float | None]:
    """(phase, exit code or None, elapsed seconds) of a job, from its root ConfigMap and launcher pod."""
    created = _seconds(root["metadata"].get("creationTimestamp"))
    result = json.loads((root.get("data") or {}).get(RESULT_KEY) or "null")
    if result is not None:
        end = _seconds(result.get("finished")) or now
        return (
            ("Succeeded" if result["exit_code"] == 0 else "Failed"),
            result["exit_code"],
            (end - created if created else None),
        )
    code = launcher_exit(launcher) if launcher else None
    if code is not None:
        return ("Succeeded" if code == 0 else "Failed"), code, (now - created if created else None)
    if launcher is not None:
        phase = (launcher.get("status") or {}).get("phase") or "Pending"
    elif json.loads((root.get("data") or {}).get("launch.json") or "{}").get("detach"):
        phase = "Unknown (no launcher pod)"  # its reaper records the outcome shortly
    else:
        phase = "Attached"
    return phase, None, (now - created if created else None)


def outcome_line(root: dict) -> str | None:
    """What ended a detached job, as its launcher (or, when the launcher could not, its reaper) recorded it."""
    result = json.loads((root.get("data") or {}).get(RESULT_KEY) or "null")
    return f"outcome: {result['failure']}" if result and result.get("failure") else None


def ended_why(pod: dict) -> str:
    """`` (OOMKilled)``, `` (Error)``: how the launcher container ended, in the kubelet's word."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        reason = ((cs.get("state") or {}).get("terminated") or {}).get("reason")
        if cs.get("name") == LAUNCHER_CONTAINER and reason and reason != "Completed":
            return f" ({reason})"
    return ""


def status(args, stream) -> int:
    api = _manage_api(args)
    root = _root(api, args.name)
    plan = json.loads((root.get("data") or {}).get("plan.json") or "{}")
    pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name}")["items"]
    launcher = next((p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == "launcher"), None)
    phase, code, elapsed = job_phase(root, launcher, time.time())
    print(
        f"job {args.name}  namespace {api.namespace}  {phase}"
        + (f" (exit {code})" if code is not None else "")
        + (f"  elapsed {elapsed:.0f}s" if elapsed is not None else "")
        + f"  ranks={plan.get('ranks')}  gpus={plan.get('gpus')}  "
        f"created {root['metadata'].get('creationTimestamp')}",
        file=stream,
    )
    outcome = outcome_line(root)
    if outcome:
        print(f"  {outcome}", file=stream)
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        role = (pod["metadata"].get("labels") or {}).get(ROLE_LABEL, "?")
        code = launcher_exit(pod) if role == "launcher" else None
        print(
            f"  {pod['metadata']['name']:40s} {role:8s} {status.get('phase', '?'):10s} "
            f"ready={pod_ready(pod)!s:5s} node={(pod.get('spec') or {}).get('nodeName')}"
            + (f" exit={code}{ended_why(pod)}" if code is not None else ""),
            file=stream,
        )
    return 0


def wait(args, stream) -> int:
    """Block until the job's launcher ends; its exit code (and failure line) become ours."""
    api = _manage_api(args)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        root = _root(api, args.name)
        pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name},{ROLE_LABEL}=launcher")["items"]
        if not pods and RESULT_KEY not in (root.get("data") or {}):
            if not json.loads((root.get("data") or {}).get("launch.json") or "null"):
                raise UsageError(
                    f"job {args.name} has no launcher in the cluster (it runs with --launcher local)",
                    "its mpilaunch on the submitting machine reports the outcome",
                )
        phase, code, elapsed = job_phase(root, pods[0] if pods else None, time.time())
        if code is not None:
            result = json.loads((root.get("data") or {}).get(RESULT_KEY) or "null") or {}
            if code != 0:
                print(
                    f"mpilaunch: error: {result.get('failure') or f'the launcher exited with code {code}'}",
                    file=sys.stderr,
                )
            if result.get("summary"):  # the closing summary, as the job's launcher posted it
                print("\n".join(summary.lines(result["summary"])), file=sys.stderr)
            print(f"job {args.name} {phase.lower()} (exit {code}) after {elapsed or 0:.0f}s", file=stream)
            return code
        if deadline is not None and time.monotonic() > deadline:
            print(f"mpilaunch: error: job {args.name} still {phase} after --timeout {args.timeout:g}s", file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(1.0)


def logs(args, stream) -> int:
    api = _manage_api(args)
    pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name},{ROLE_LABEL}=launcher")["items"]
    if not pods:
        _root(api, args.name)  # no such job, or not an mpilaunch one, rather than "no launcher pod"
        raise UsageError(
            f"job {args.name} has no launcher pod in namespace {api.namespace}",
            "jobs run with --launcher local print their output on the submitting machine; workers only sleep",
        )
    path = api.collection_path("v1", "pods", api.namespace) + f"/{pods[0]['metadata']['name']}/log"
    query = {"container": LAUNCHER_CONTAINER}
    if getattr(args, "follow", False):
        query["follow"] = "true"
    # following: the log may be quiet for long stretches, which is no error
    conn, resp = api.request("GET", path, query=query, stream=True, timeout=86400.0 if "follow" in query else None)
    try:
        for raw in iter(resp.readline, b""):
            stream.write(raw.decode("utf-8", "replace"))
            stream.flush()
    finally:
        conn.close()
    return 0


def stacks_channel(args) -> tuple[dict, str]:
    """How ``mpilaunch stacks NAME`` reaches the worker pods of a job with a cluster launcher
    (detached, or attached from another machine): the exec API with the user's own credentials (the
    ``edit`` role may exec), every pod the launch description names, and the Python the ranks' wrapper
    runs with there (as the attached job's probe: ``hang_watch.probe_python``)."""
    api = _manage_api(args)
    root = _root(api, args.name)
    data = root.get("data") or {}
    if data.get(RESULT_KEY):
        code = json.loads(data[RESULT_KEY]).get("exit_code")
        raise UsageError(
            f"job {args.name} has ended (exit {code}): it has no ranks to take stacks of",
            f"its diagnosis, if it hung: mpilaunch logs {args.name}",
        )
    if not data.get("launch.json"):
        raise UsageError(
            f"job {args.name} runs its mpirun in the mpilaunch that started it (--launcher local)",
            "run mpilaunch stacks on that machine",
        )
    description = LaunchDescription.from_dict(json.loads(data["launch.json"]))
    # the container the launcher pod reaches too (ReadyPods.exec_context)
    container = description.cluster.get("container", WORKER_CONTAINER)
    context = exec_api_context(api.creds, description.addresses(), container)
    return context, rank_python(list(description.rank_prefix))


def exec_credentials(args, namespace: str | None = None) -> dict:
    """The user's own credentials for the exec API (server, TLS settings, CA, client certificate or
    token), from --kubeconfig and --context, in --namespace or else ``namespace``: what `mpilaunch
    stacks` reaches the pods of a job found in a run directory on this machine with (its context
    names none it would take: ``hang.local_job``). Nothing written: the token stays in memory."""
    return resolve(args.kubeconfig, args.context, args.namespace or namespace, None)


def delete(args, stream) -> int:
    """Delete job NAME: its root ConfigMap (only if mpilaunch's, and only the
    very object checked: a uid precondition) and what that root owns."""
    api = _manage_api(args)
    root_uid = ""  # no root: leave alone a ConfigMap of that name made meanwhile
    try:
        root = api.get("v1", "configmaps", args.name)
    except ApiError as e:
        if e.status != 404:
            raise
        # the root is gone but objects of the job may be left (a delete that was cut short)
        selector = f"{JOB_LABEL}={args.name}"
        left = api.get("v1", "pods", labelSelector=selector)["items"]
        left += api.get("batch/v1", "jobs", labelSelector=selector)["items"]
        if not any(owned_by_root(args.name, "", obj, set()) for obj in left):
            raise UsageError(f"no job {args.name} in namespace {api.namespace}", _LIST_HINT) from None
    else:
        _check_ours(api, root, args.name)  # someone else's ConfigMap: refuse, delete nothing
        root_uid = root["metadata"]["uid"]
    try:
        delete_job(api, args.name, [], wait=30.0, root_uid=root_uid)
    except ApiError as e:
        if e.status != 409:
            raise
        raise UsageError(
            f"configmap {args.name} in namespace {api.namespace} was replaced while it was being "
            f"deleted; nothing was deleted",
            "run mpilaunch delete again",
        ) from None
    print(f"deleted job {args.name} in namespace {api.namespace}", file=stream)
    return 0


_KINDS = [
    ("batch/v1", "jobs"),  # before the pods: a Job's pods are the job's when the Job is
    ("v1", "pods"),
    ("v1", "services"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("v1", "serviceaccounts"),
    ("coordination.k8s.io/v1", "leases"),
    ("scheduling.volcano.sh/v1beta1", "podgroups"),
    ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
    ("v1", "secrets"),
    ("networking.k8s.io/v1", "networkpolicies"),
]


def owner_uids(obj: dict, kind: str, name: str | None = None) -> set[str]:
    """The uids of ``obj``'s owners of that kind (and name)."""
    return {
        o.get("uid")
        for o in (obj.get("metadata") or {}).get("ownerReferences") or ()
        if o.get("kind") == kind and (name is None or o.get("name") == name)
    }


def owned_by_root(job: str, root_uid: str, obj: dict, job_uids: set[str]) -> bool:
    """Is ``obj`` one of job ``job``'s objects: owned by its root ConfigMap (the one of ``root_uid``;
    ``""``: the root is gone, any ConfigMap named ``job`` was it), or, for a pod, by one of the job's
    Jobs (``job_uids``: its launcher's, its reaper's)? A label alone says nothing: anyone may put
    ``mpilaunch/job=NAME`` on anything, and another job's leftovers under that name carry it too."""
    roots = owner_uids(obj, "ConfigMap", job)
    if roots and (root_uid == "" or root_uid in roots):
        return True
    return bool(owner_uids(obj, "Job") & job_uids)


def delete_job(
    api: Api, job: str, created: list[tuple[str, str, str]], wait: float, root_uid: str | None = None
) -> None:
    """Delete the root (garbage collection) and, not to depend on the GC's
    pace, every object labelled with the job that the root owns (or one of
    the job's Jobs, for their pods); wait until those pods are gone.

    ``root_uid``: delete the root only if it is still that object (an
    ApiError 409 otherwise, before anything else is deleted); ``""``: the
    root is known to be gone, so a ConfigMap of that name made since is not
    touched, and what a ConfigMap of that name owned is the job's.
    ``None``: the root, whatever it is now, and only the objects it owns."""
    selector = f"{JOB_LABEL}={job}"
    background = {"propagationPolicy": "Background"}
    if root_uid is None:
        try:
            root_uid = api.get("v1", "configmaps", job)["metadata"]["uid"]
        except ApiError as e:
            if e.status != 404:
                raise
            root_uid = ""
    errors = []
    deadline = time.monotonic() + wait
    if root_uid:
        try:
            retrying_transient(
                lambda: api.delete("v1", "configmaps", job, **background, preconditions={"uid": root_uid}), deadline
            )
        except ApiError as e:
            if e.status != 404 and is_transient(e):
                errors.append(f"configmaps: {e.message}")
            elif e.status != 404:  # 409: not that root any more; nothing else is touched
                raise
        except OSError as e:  # as below: the rest is still deleted by hand
            errors.append(f"configmaps: {e}")
    names = {(v, p) for v, p, _ in created}
    if not created or admission.WORKLOADS in names:  # --queue: Kueue holds the pods until its Workload goes
        admission.release_workload(api, job)
    job_uids: set[str] = set()

    def ours(obj: dict) -> bool:
        return owned_by_root(job, root_uid, obj, job_uids)

    def delete_kind(api_version: str, plural: str) -> None:
        items = api.get(api_version, plural, labelSelector=selector)["items"]
        mine = [item for item in items if ours(item)]
        if plural == "jobs":
            job_uids.update(item["metadata"]["uid"] for item in mine)
        if plural in ("pods", "jobs") and mine and len(mine) == len(items):
            # all of them the job's (the usual case): one call, however many pods
            api.delete_collection(api_version, plural, selector, **background)
        else:
            for item in mine:
                meta = item["metadata"]
                try:
                    api.delete(api_version, plural, meta["name"], **background, preconditions={"uid": meta["uid"]})
                except ApiError as e:
                    if e.status not in (404, 409):  # gone already (409: its name taken since)
                        raise

    for api_version, plural in _KINDS:
        if created and (api_version, plural) not in names:
            continue
        try:
            retrying_transient(lambda: delete_kind(api_version, plural), deadline)
        except ApiError as e:
            # A kind the user may not list (a tenant with the built-in "edit" role and Roles,
            # RoleBindings or a gang scheduler's PodGroups; someone else's Secrets): the root owns
            # every object of the job, so the garbage collector takes them. Pods and Jobs the user
            # must be able to delete: a refusal there is an error. 409: a uid precondition failed,
            # the object is gone and its name taken since.
            if e.status not in (404, 405, 409) and not (e.status == 403 and plural not in ("pods", "jobs")):
                errors.append(f"{plural}: {e.message}")
        except OSError as e:
            # still failing at the deadline: the other kinds are still deleted
            errors.append(f"{plural}: {e}")
    wait_pods_gone(api, selector, wait, ours)
    if errors:
        raise RuntimeError("; ".join(errors))


#: API answers that say "not now" rather than "no": a loaded or restarting API server (429 with
#: Retry-After from its max-in-flight limit, 5xx while etcd or the server catches up)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def is_transient(error: Exception) -> bool:
    """A failure worth asking again: the call never reached the server or was turned away for now."""
    if isinstance(error, ApiError):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, OSError)


def retrying_transient(call, deadline: float, first_pause: float = 0.25, longest_pause: float = 2.0):
    """``call()``, asked again after a transient failure until ``deadline`` (then that failure is raised).

    Why release needs it (issue 49, item 4): under a run from nothing's load, one timed-out or
    turned-away call of release's left the job's pods to the garbage collector, whose pace on a
    loaded, freshly started control plane kept them in the API more than a minute after
    mpilaunch exited 0. A second try a moment later deletes them itself."""
    pause = first_pause
    while True:
        try:
            return call()
        except (ApiError, OSError) as e:
            if not is_transient(e) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, longest_pause)


def wait_pods_gone(api: Api, selector: str, wait: float, ours=lambda pod: True) -> None:
    """Until no pod matches ``selector`` (and ``ours``), at most ``wait`` seconds. The kubelet
    removes pods at its once-a-second relist: a few pods are watched, so that the job ends when they
    are gone and not up to a poll later (many are looked at every 0.5 s)."""

    def left() -> int:  # 0 also when the pods cannot be listed: nothing more to wait for
        try:
            return sum(1 for pod in api.get("v1", "pods", labelSelector=selector)["items"] if ours(pod))
        except (ApiError, OSError):
            return 0

    started = time.monotonic()
    count = left()
    if not count:
        return
    with waiter(api, api.namespace, selector, count) as pause:
        while count and time.monotonic() < started + wait:
            pause(ready_poll_s(time.monotonic() - started, count))
            count = left()
