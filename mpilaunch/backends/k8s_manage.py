"""``mpilaunch status|logs|delete NAME --backend k8s``, and deleting a job's objects."""

from __future__ import annotations

import json
import time

from ..errors import UsageError
from .k8s_api import Api, ApiError, resolve
from .k8s_pods import JOB_LABEL, LAUNCHER_CONTAINER, ROLE_LABEL, _launcher_exit, _pod_ready


def _manage_api(args) -> Api:
    return Api(resolve(args.kubeconfig, args.context, args.namespace, None))

def status(args, stream) -> int:
    api = _manage_api(args)
    try:
        root = api.get("v1", "configmaps", args.name)
    except ApiError as e:
        if e.status == 404:
            raise UsageError(f"no job {args.name} in namespace {api.namespace}", "list jobs with: kubectl get configmap -l mpilaunch/job") from None
        raise
    plan = json.loads((root.get("data") or {}).get("plan.json") or "{}")
    pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name}")["items"]
    print(f"job {args.name}  namespace {api.namespace}  ranks={plan.get('ranks')}  gpus={plan.get('gpus')}  "
          f"created {root['metadata'].get('creationTimestamp')}", file=stream)
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        role = (pod["metadata"].get("labels") or {}).get(ROLE_LABEL, "?")
        code = _launcher_exit(pod) if role == "launcher" else None
        print(f"  {pod['metadata']['name']:40s} {role:8s} {status.get('phase', '?'):10s} "
              f"ready={_pod_ready(pod)!s:5s} node={(pod.get('spec') or {}).get('nodeName')}"
              + (f" exit={code}" if code is not None else ""), file=stream)
    return 0

def logs(args, stream) -> int:
    api = _manage_api(args)
    pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name},{ROLE_LABEL}=launcher")["items"]
    if not pods:
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

def delete(args, stream) -> int:
    api = _manage_api(args)
    try:
        api.get("v1", "configmaps", args.name)
    except ApiError as e:
        if e.status != 404:
            raise
        pods = api.get("v1", "pods", labelSelector=f"{JOB_LABEL}={args.name}")["items"]
        if not pods:
            raise UsageError(f"no job {args.name} in namespace {api.namespace}", None) from None
    delete_job(api, args.name, [], wait=30.0)
    print(f"deleted job {args.name} in namespace {api.namespace}", file=stream)
    return 0


_KINDS = [
    ("batch/v1", "jobs"), ("v1", "pods"), ("v1", "services"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"), ("rbac.authorization.k8s.io/v1", "roles"),
    ("v1", "serviceaccounts"), ("coordination.k8s.io/v1", "leases"), ("scheduling.volcano.sh/v1beta1", "podgroups"),
    ("scheduling.x-k8s.io/v1alpha1", "podgroups"),
]


def delete_job(api: Api, job: str, created: list[tuple[str, str, str]], wait: float) -> None:
    """Delete the root (garbage collection) and, not to depend on the GC's
    pace, everything labelled with the job; wait until its pods are gone."""
    selector = f"{JOB_LABEL}={job}"
    background = {"propagationPolicy": "Background"}
    api.delete("v1", "configmaps", job, **background)
    errors = []
    names = {(v, p) for v, p, _ in created}
    for api_version, plural in _KINDS:
        if created and (api_version, plural) not in names:
            continue
        try:
            if plural in ("pods", "jobs"):
                api.delete_collection(api_version, plural, selector, **background)
            else:
                items = api.get(api_version, plural, labelSelector=selector)["items"]
                for item in items:
                    api.delete(api_version, plural, item["metadata"]["name"], **background)
        except ApiError as e:
            if e.status not in (404, 405):
                errors.append(f"{plural}: {e.message}")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if not api.get("v1", "pods", labelSelector=selector)["items"]:
                break
        except (ApiError, OSError):
            break
        time.sleep(0.3)
    if errors:
        raise RuntimeError("; ".join(errors))
