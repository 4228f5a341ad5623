"""Who the job's in-cluster pieces act as: a per-job identity, or one an admin made once.

By default every job creates a ServiceAccount, Role and RoleBinding per
in-cluster piece (the launcher's, the reaper's), each naming the job's own
objects only. The built-in ``edit`` role, what a tenant of a shared cluster
usually holds, may not create Roles or RoleBindings (only ``admin`` may). So
an admin applies ``mpilaunch rbac --namespace NS`` once, and jobs run with
``--service-account mpilaunch``: they create no RBAC object at all.

Before creating anything, a job without ``--service-account`` asks the API
server whether its user may create what the per-job identities need (a
SelfSubjectAccessReview, which any authenticated user may create), so a
tenant gets one line naming the fix instead of a job half made.
"""

from __future__ import annotations

import json

from ...core.errors import UsageError

DEFAULT_ACCOUNT = "mpilaunch"
# (apiGroup, resource) a job without --service-account creates, for its launcher's and reaper's identities
PER_JOB_OBJECTS = (
    ("", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
)
# What any job's launcher and reaper do, namespace-wide (the per-job Roles grant the same by name,
# each piece only its own share: k8s-rbac.yaml.j2, k8s-reaper.yaml.j2). Each verb is one that a
# call in the in-cluster pieces makes (launcher.py, reaper.py, orphan.reap, detached.py,
# hang_event.py, transport.py); nothing lists, nothing watches but the launcher's wait for a pod
# by name. tests/unit/test_k8s_rbac.py holds the table of those calls.
RULES = (
    # the launcher waits for its workers (get; watch one by name), and a detached job's launcher
    # or reaper releases them (delete)
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "delete"]},
    # --transport exec: mpirun's daemons through the exec API (a websocket upgrade, a GET, which
    # newer API servers authorize as create)
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    # the job's root ConfigMap: a detached job's outcome is recorded there, an orphan's is deleted
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch", "delete"]},
    # the attached job's heartbeat, which the reaper reads
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]},
    # a detached job's launcher Job, which the reaper reads and, stuck, deletes
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "delete"]},
    # a detached job's Secrets (<job>-env, <job>-agent), deleted once its outcome is recorded
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"]},
    # a detached job's hang verdict, posted by its launcher on its own pod
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)


def objects(namespace: str, account: str = DEFAULT_ACCOUNT) -> list[dict]:
    """The namespaced objects an admin applies once: nothing cluster-wide."""
    meta = {"name": account, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "mpilaunch"}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta), "automountServiceAccountToken": True},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [dict(r) for r in RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]


def render(namespace: str, account: str = DEFAULT_ACCOUNT) -> str:
    """YAML for ``kubectl apply -f -`` (JSON is YAML; no YAML library needed)."""
    head = (
        f"# mpilaunch's identity in namespace {namespace}: apply once as an admin of the namespace,\n"
        f"#   mpilaunch rbac --namespace {namespace} | kubectl apply -f -\n"
        f"# then users holding only the built-in 'edit' role run jobs with --service-account {account}\n"
    )
    return head + "".join(f"---\n{json.dumps(obj, indent=2)}\n" for obj in objects(namespace, account))


def access_review(namespace: str, group: str, resource: str, verb: str = "create") -> dict:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "group": group, "resource": resource, "verb": verb}},
    }


def missing_permissions(allowed: dict[tuple[str, str], bool]) -> list[str]:
    """``allowed``: (group, resource) -> the review's answer; the plural names of what is denied."""
    return [resource for (group, resource), ok in allowed.items() if not ok]


def refusal(namespace: str, missing: list[str]) -> UsageError:
    return UsageError(
        f"you may not create {', '.join(missing)} in namespace {namespace}, which each job's launcher and reaper "
        f"identities need",
        f"ask an admin of the namespace to run once: mpilaunch rbac --namespace {namespace} | kubectl apply -f - ; "
        f"then add --service-account {DEFAULT_ACCOUNT}",
    )


def check_may_create_identities(api, namespace: str) -> None:
    """UsageError (exit 2, nothing created) when the user may not create the per-job identities.

    An API server that cannot answer (an old one, an outage) is not a verdict: the creation
    itself then says what it refuses."""
    from .api import ApiError

    allowed = {}
    for group, resource in PER_JOB_OBJECTS:
        try:
            answer = api.request(
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body=access_review(namespace, group, resource),
            )
        except (ApiError, OSError):
            return
        allowed[(group, resource)] = bool((answer.get("status") or {}).get("allowed"))
    missing = missing_permissions(allowed)
    if missing:
        raise refusal(namespace, missing)
