"""What the cluster tells the job's NetworkPolicies, asked at ``allocate`` (``network_policy.py`` is
the pure part: what each answer makes).

* ``--network-policy job``: which of the job's pods the namespace's own policies isolate for
  egress already (only those get the job's egress allowances);
* where egress policies are made: the cluster's DNS Service (its pods are then the only DNS
  destination) and the ``kubernetes`` Service's endpoints (their ports), each where the caller may
  read them: a tenant bound to ``edit`` may not, and gets the rules by port;
* ``--launcher local``: the submitting side, once the pods have addresses (the source address of
  the route to them), let into the job's policies for exactly what the launch needs.
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor

from ...core import env_names
from ...core.errors import AllocationError, UsageError
from . import network_policy
from .api import ApiError
from .launch import AGENT_PORT

# where a pod finds its own namespace (every pod with a ServiceAccount token mounted)
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
POD_NAME_ENV = env_names.POD_NAME  # the downward API's metadata.name, where the pod's hostname is not it


def egress_isolated_roles(api, namespace: str, objects, job: str) -> list[str]:
    """--network-policy job: which roles of the job's pods the namespace's NetworkPolicies isolate
    for egress already (network_policy.py): only those get the job's egress allowances."""
    try:
        policies = api.get("networking.k8s.io/v1", "networkpolicies", namespace=namespace)["items"]
    except ApiError as e:
        if e.status == 403:
            raise UsageError(
                f"--network-policy job: you may not list NetworkPolicies in namespace {namespace} "
                "(mpilaunch looks whether they isolate the job's pods for egress before it adds its own)",
                "--network-policy strict (the job's pods then reach only each other, DNS and the API "
                "server) or --network-policy none (the namespace's policies alone)",
            ) from None
        raise AllocationError(
            f"cannot list the NetworkPolicies of namespace {namespace}: {e.message}", "check the API server"
        ) from None
    except OSError as e:
        raise AllocationError(
            f"cannot list the NetworkPolicies of namespace {namespace}: {e}", "check the API server"
        ) from None
    return network_policy.egress_isolated_roles(policies, network_policy.pod_labels(objects), job)


def with_policies(backend, objects, admission_check):
    """``objects`` with the job's NetworkPolicies made from what the cluster says; its questions are
    asked beside ``admission_check(objects)`` (no more round trips than it takes where the namespace
    leaves egress open). Sets ``backend.egress_isolated_roles`` and ``backend.egress_peers``."""
    from . import manifests

    mode = backend.opts.network_policy
    if mode == "none":
        admission_check(objects)
        return objects
    # strict: every pod gets egress rules; job: only the pods the namespace isolates already
    isolated = peers = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        if mode == "job":
            isolated = pool.submit(egress_isolated_roles, backend.api, backend.namespace, objects, backend.job)
        else:
            peers = pool.submit(egress_peers, backend.api)
        admission_check(objects)
    if isolated is not None:
        backend.egress_isolated_roles = isolated.result()
    if peers is not None:
        backend.egress_peers = peers.result()
    elif backend.egress_isolated_roles:
        backend.egress_peers = egress_peers(backend.api)
    theirs = manifests.network_policies(backend)
    objects = [o for o in objects if o[1]["kind"] != "NetworkPolicy"]
    at = next(i for i, (g, _) in enumerate(objects) if g == "setup")
    objects[at:at] = theirs
    return objects


def _readable(api, api_version: str, plural: str, name: str, namespace: str) -> dict | None:
    """The object, or None where it is missing or the caller may not read it (nothing to narrow)."""
    try:
        return api.get(api_version, plural, name, namespace=namespace)
    except (ApiError, OSError):
        return None


def egress_peers(api) -> dict:
    """``dns_service`` (the first of ``network_policy.DNS_SERVICES`` found) and ``api_endpoints``
    (``default/endpoints/kubernetes``), None where not readable; asked at once (one round trip)."""
    asked = [("v1", "services", name, ns) for ns, name in network_policy.DNS_SERVICES]
    asked.append(("v1", "endpoints", "kubernetes", "default"))
    with ThreadPoolExecutor(max_workers=len(asked)) as pool:
        answers = list(pool.map(lambda a: _readable(api, *a), asked))
    *services, endpoints = answers
    return {"dns_service": next((s for s in services if s), None), "api_endpoints": endpoints}


def own_pod(api) -> dict | None:
    """This process's own Pod, where mpilaunch runs inside the cluster and may read it."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    try:
        with open(POD_NAMESPACE_FILE) as f:
            namespace = f.read().strip()
    except OSError:
        return None
    name = os.environ.get(POD_NAME_ENV) or socket.gethostname()
    return _readable(api, "v1", "pods", name, namespace) if namespace else None


def let_in_submitter(backend, address: str | None) -> None:
    """--launcher local under the job's NetworkPolicies: the submitting side talks to the pods too.
    Its address on the route to the pods is known only once they have theirs. Patched only where
    something is missing: a relaunch lets the same side in again."""
    if not address or backend.opts.network_policy == "none":
        return
    rules = network_policy.submitter_rules(
        network_policy.submitter_peer(address, own_pod(backend.api)),
        callbacks=backend.spec.mode != "ps",
        agent=backend.transport == "agent",
        agent_port=AGENT_PORT,
    )
    if not rules["ingress"] and not rules["egress"]:
        return
    api, job = backend.api, backend.job
    made = [name for _, plural, name in backend.created if plural == "networkpolicies" and name != f"{job}-api"]
    try:
        for name in made:  # <job> (ingress) and, where it was made, <job>-egress
            patch = network_policy.submitter_patch(api.get("networking.k8s.io/v1", "networkpolicies", name), rules)
            if patch is not None:
                api.patch("networking.k8s.io/v1", "networkpolicies", name, patch)
    except ApiError as e:
        raise AllocationError(
            f"cannot let this machine ({address}) into the job's NetworkPolicy {job}: {e.message}",
            "or run with --network-policy none",
        ) from None
