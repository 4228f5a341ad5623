"""``mpilaunch status|logs|wait|delete|stacks NAME --backend k8s`` (``K8sNamedJob``), and deleting a
job's objects."""

from __future__ import annotations

import calendar
import json
import time

from ...core.errors import UsageError
from ..launch_description import LaunchDescription
from ..named_job import ATTACHED, FAILED, PENDING, RUNNING, SUCCEEDED, UNKNOWN, JobEntry, JobState, JobStatus, NamedJob
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


def job_state(name: str, root: dict, launcher: dict | None, now: float) -> JobState:
    """The job's state, from its root ConfigMap (the outcome its launcher or reaper recorded) and
    its launcher pod."""
    created = _seconds(root["metadata"].get("creationTimestamp"))
    data = root.get("data") or {}
    result = json.loads(data.get(RESULT_KEY) or "null")
    label = f"job {name}"
    if result is not None:
        code = result["exit_code"]
        end = _seconds(result.get("finished")) or now
        failure = (result.get("failure") or f"the launcher exited with code {code}") if code else None
        return JobState(
            label, SUCCEEDED if code == 0 else FAILED, code, (end - created if created else None), failure,
            result.get("summary"),
        )  # fmt: skip
    elapsed = now - created if created else None
    code = launcher_exit(launcher) if launcher else None
    if code is not None:
        failure = f"the launcher exited with code {code}" if code else None
        return JobState(label, SUCCEEDED if code == 0 else FAILED, code, elapsed, failure)
    if launcher is not None:
        phase = (launcher.get("status") or {}).get("phase") or PENDING
        return JobState(label, phase if phase in (PENDING, RUNNING) else UNKNOWN, None, elapsed)
    if json.loads(data.get("launch.json") or "{}").get("detach"):
        return JobState(
            label, UNKNOWN, None, elapsed, note="(no launcher pod)"
        )  # its reaper records the outcome shortly
    return JobState(label, ATTACHED, None, elapsed)


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


class K8sNamedJob(NamedJob):
    """Job NAME in a namespace: its root ConfigMap (only one mpilaunch made), the pods and Jobs it
    owns, its launcher pod's log; stacks through the exec API with the user's own credentials."""

    def __init__(self, args):
        super().__init__(args)
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = _manage_api(self.args)
        return self._api

    def status(self) -> JobStatus:
        api, name = self.api, self.name
        root = _root(api, name)
        plan = json.loads((root.get("data") or {}).get("plan.json") or "{}")
        pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={name}")["items"]
        launcher = next((p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE_LABEL) == "launcher"), None)
        details = [outcome_line(root)] if outcome_line(root) else []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            status = pod.get("status") or {}
            role = (pod["metadata"].get("labels") or {}).get(ROLE_LABEL, "?")
            code = launcher_exit(pod) if role == "launcher" else None
            details.append(
                f"{pod['metadata']['name']:40s} {role:8s} {status.get('phase', '?'):10s} "
                f"ready={pod_ready(pod)!s:5s} node={(pod.get('spec') or {}).get('nodeName')}"
                + (f" exit={code}{ended_why(pod)}" if code is not None else "")
            )
        entry = JobEntry(
            title=f"job {name}  namespace {api.namespace}",
            state=job_state(name, root, launcher, time.time()),
            facts=f"ranks={plan.get('ranks')}  gpus={plan.get('gpus')}  created {root['metadata'].get('creationTimestamp')}",
            details=details,
        )
        return JobStatus([entry])

    def state(self) -> JobState:
        """Where the job's launcher is; once it ended, its exit code and failure (as it recorded them)."""
        root = _root(self.api, self.name)
        pods = self.api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={self.name},{ROLE_LABEL}=launcher")["items"]
        if not pods and RESULT_KEY not in (root.get("data") or {}):
            if not json.loads((root.get("data") or {}).get("launch.json") or "null"):
                raise UsageError(
                    f"job {self.name} has no launcher in the cluster (it runs with --launcher local)",
                    "its mpilaunch on the submitting machine reports the outcome",
                )
        return job_state(self.name, root, pods[0] if pods else None, time.time())

    def logs(self, stream, follow: bool) -> None:
        api = self.api
        pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={self.name},{ROLE_LABEL}=launcher")["items"]
        if not pods:
            _root(api, self.name)  # no such job, or not an mpilaunch one, rather than "no launcher pod"
            raise UsageError(
                f"job {self.name} has no launcher pod in namespace {api.namespace}",
                "jobs run with --launcher local print their output on the submitting machine; workers only sleep",
            )
        path = api.collection_path("v1", "pods", api.namespace) + f"/{pods[0]['metadata']['name']}/log"
        query = {"container": LAUNCHER_CONTAINER}
        if follow:
            query["follow"] = "true"
        # following: the log may be quiet for long stretches, which is no error
        conn, resp = api.request("GET", path, query=query, stream=True, timeout=86400.0 if follow else None)
        try:
            for raw in iter(resp.readline, b""):
                stream.write(raw.decode("utf-8", "replace"))
                stream.flush()
        finally:
            conn.close()

    def stacks(self, deadline_s: float):
        """Through the exec API into the worker pods of a job with a cluster launcher (detached, or
        attached from another machine), with the user's own credentials (the ``edit`` role may
        exec): every pod the launch description names, with the Python the ranks' wrapper runs with
        there (as the attached job's probe: ``hang_watch.probe_python``)."""
        from ...hang import collect

        root = _root(self.api, self.name)
        data = root.get("data") or {}
        if data.get(RESULT_KEY):
            code = json.loads(data[RESULT_KEY]).get("exit_code")
            raise UsageError(
                f"job {self.name} has ended (exit {code}): it has no ranks to take stacks of",
                f"its diagnosis, if it hung: mpilaunch logs {self.name}",
            )
        if not data.get("launch.json"):
            raise UsageError(
                f"job {self.name} runs its mpirun in the mpilaunch that started it (--launcher local)",
                "run mpilaunch stacks on that machine",
            )
        description = LaunchDescription.from_dict(json.loads(data["launch.json"]))
        # the container the launcher pod reaches too (ReadyPods.exec_context)
        container = description.cluster.get("container", WORKER_CONTAINER)
        context = exec_api_context(self.api.creds, description.addresses(), container)
        return collect.collect_from_context(context, rank_python(list(description.rank_prefix)), deadline_s=deadline_s)

    def exec_credentials(self, namespace: str | None) -> dict:
        """From --kubeconfig and --context, in --namespace or else ``namespace``. Nothing written:
        the token stays in memory."""
        return resolve(self.args.kubeconfig, self.args.context, self.args.namespace or namespace, None)

    def delete(self, stream) -> None:
        """Its root ConfigMap (only if mpilaunch's, and only the very object checked: a uid
        precondition) and what that root owns."""
        api, name = self.api, self.name
        root_uid = ""  # no root: leave alone a ConfigMap of that name made meanwhile
        try:
            root = api.get("v1", "configmaps", name)
        except ApiError as e:
            if e.status != 404:
                raise
            # the root is gone but objects of the job may be left (a delete that was cut short)
            selector = f"{JOB_LABEL}={name}"
            left = api.get("v1", "pods", labelSelector=selector)["items"]
            left += api.get("batch/v1", "jobs", labelSelector=selector)["items"]
            if not any(owned_by_root(name, "", obj, set()) for obj in left):
                raise UsageError(f"no job {name} in namespace {api.namespace}", _LIST_HINT) from None
        else:
            _check_ours(api, root, name)  # someone else's ConfigMap: refuse, delete nothing
            root_uid = root["metadata"]["uid"]
        try:
            delete_job(api, name, [], wait=30.0, root_uid=root_uid)
        except ApiError as e:
            if e.status != 409:
                raise
            raise UsageError(
                f"configmap {name} in namespace {api.namespace} was replaced while it was being deleted; nothing was deleted",
                "run mpilaunch delete again",
            ) from None
        print(f"deleted job {name} in namespace {api.namespace}", file=stream)


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
