"""The job's NetworkPolicies (``--network-policy job|strict``): what they open and close (pure).

NetworkPolicies are allow-lists that add up: a pod selected by no policy of a
direction is open in that direction; once one policy selects it for Ingress
(or Egress), it is isolated in that direction and only the union of every
such policy's rules is allowed. So a policy can only take traffic away from a
pod that was open, and only add traffic to a pod that was isolated already.

* ``<job>`` (Ingress; ``job`` and ``strict``): every pod of the job accepts
  connections from the job's pods only (and, with ``--launcher local``, the
  submitting machine): nothing outside the job reaches a worker's agent or
  the ports the MPI daemons and ranks listen on. Taking this away from an
  open namespace is the point of it.
* ``<job>-egress`` (Egress: the job's pods, DNS, the submitting machine) and
  ``<job>-api`` (Egress: the API server, for the launcher and the reaper):
  under ``strict``, for every pod of the job (they then reach nothing else).
  Under ``job`` (the default), only for the roles whose pods the
  namespace's own policies isolate for egress already
  (:func:`egress_isolated_roles`): there they only add what the job needs to
  what the namespace allows; where the namespace leaves egress open they are
  not made, and the job's pods reach what any pod of the namespace reaches
  (object stores, model hubs, package mirrors, other namespaces' Services).

With ``--launcher local`` the submitting machine talks to the pods too
(mpirun's daemons and the ranks connect back to it; the agent transport's
shims connect in): its address is known once the pods have theirs (the
source address of the route to them), so it is added then
(``submitter_patch``).

NetworkPolicies are evaluated after a Service's DNAT on every common
enforcer, so the API server is allowed by its endpoint's port, not by the
``kubernetes`` Service's address (which a tenant may not read): 443, 6443
and the port of the kubeconfig's server.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .pods import JOB_LABEL, ROLE_LABEL

DEFAULT_API_PORTS = (443, 6443)
ROLES = ("launcher", "reaper", "worker")  # every pod's mpilaunch/role
API_ROLES = ("launcher", "reaper")  # the pods that talk to the API server


def api_ports(server: str | None) -> list[dict]:
    ports = set(DEFAULT_API_PORTS)
    if server:
        try:
            port = urlsplit(server).port
        except ValueError:
            port = None
        if port:
            ports.add(port)
    return [{"protocol": "TCP", "port": p} for p in sorted(ports)]


# ------------------------------------------------------------------ does the namespace isolate egress?


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A Kubernetes label selector (``matchLabels``, ``matchExpressions``) against a pod's labels;
    an empty selector selects every pod."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an operator this code does not know: assume it does not select
    return True


def isolates_egress(policy: dict) -> bool:
    """Whether ``policy`` isolates the pods it selects for egress: ``Egress`` among its policyTypes,
    or, where policyTypes is left out (the API server fills it in), an ``egress`` section."""
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes")
    if types is None:
        return "egress" in spec
    return "Egress" in types


def pod_labels(objects) -> list[dict]:
    """The labels of every pod the job's objects make: Pods, and the pod templates of Jobs."""
    out = []
    for _group, obj in objects:
        if obj.get("kind") == "Pod":
            out.append((obj.get("metadata") or {}).get("labels") or {})
        elif isinstance((obj.get("spec") or {}).get("template"), dict):
            out.append((obj["spec"]["template"].get("metadata") or {}).get("labels") or {})
    return out


def egress_isolated_roles(policies: list[dict], labels: list[dict], job: str) -> list[str]:
    """The roles (``mpilaunch/role``) of the job's pods that the namespace's own NetworkPolicies
    already isolate for egress: a role counts if any of its pods is selected by a policy with
    Egress. The job's own policies (labelled with the job) do not count."""
    theirs = [
        p
        for p in policies
        if ((p.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) != job and isolates_egress(p)
    ]
    roles = {
        pod[ROLE_LABEL]
        for pod in labels
        if ROLE_LABEL in pod and any(selector_matches((p.get("spec") or {}).get("podSelector"), pod) for p in theirs)
    }
    return sorted(roles)


# ------------------------------------------------------------------ what the job makes


def plan(mode: str, isolated_roles: list[str] | None) -> dict | None:
    """The template's ``network_policy`` value: ``None`` (``--network-policy none``: no policy), else
    ``egress_roles`` (the roles ``<job>-egress`` is for: ``None`` for every pod of the job, ``[]``
    for no such policy) and ``api_roles`` (``<job>-api``'s, ``[]`` for none).

    ``isolated_roles``: :func:`egress_isolated_roles`, or ``None`` where the namespace was not
    asked (``mpilaunch render``, ``--dry-run``): then ``job`` makes no egress policy."""
    if mode == "none":
        return None
    if mode == "strict":
        return {"mode": mode, "egress_roles": None, "api_roles": list(API_ROLES)}
    roles = sorted(set(isolated_roles or ()))
    return {
        "mode": mode,
        "egress_roles": roles,
        "api_roles": [r for r in API_ROLES if r in roles],
        "asked": isolated_roles is not None,
    }


def submitter_rules(address: str) -> dict:
    """The ingress and egress rules for the submitting machine (``--launcher local``)."""
    peer = [{"ipBlock": {"cidr": f"{address}/{128 if ':' in address else 32}"}}]
    return {"ingress": [{"from": peer}], "egress": [{"to": peer}]}


def submitter_patch(policy: dict, address: str) -> dict:
    """A job policy's spec with the submitting machine added in the directions it is of (a merge
    patch replaces lists whole)."""
    spec = policy["spec"]
    extra = submitter_rules(address)
    types = spec.get("policyTypes") or ["Ingress"]
    out = {}
    for direction in ("Ingress", "Egress"):
        if direction in types:
            key = direction.lower()
            out[key] = list(spec.get(key) or []) + extra[key]
    return {"spec": out}
