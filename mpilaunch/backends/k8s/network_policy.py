"""The job's NetworkPolicies (``--network-policy job``): its own traffic, and nothing else (pure).

A shared cluster's namespace commonly starts from a default-deny policy.
The job's policies (``templates/k8s-network-policy.yaml.j2``) let the job's
pods reach each other on every port, resolve names, and the launcher and
reaper reach the API server. With ``--launcher local`` the submitting
machine talks to the pods too (mpirun's daemons and the ranks connect back
to it; the agent transport's shims connect in): its address is known once
the pods have theirs (the source address of the route to them), so it is
added then (``submitter_patch``).

NetworkPolicies are evaluated after a Service's DNAT on every common
enforcer, so the API server is allowed by its endpoint's port, not by the
``kubernetes`` Service's address (which a tenant may not read): 443, 6443
and the port of the kubeconfig's server.
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_API_PORTS = (443, 6443)


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


def submitter_rules(address: str) -> dict:
    """The ingress and egress rules for the submitting machine (``--launcher local``)."""
    peer = [{"ipBlock": {"cidr": f"{address}/{128 if ':' in address else 32}"}}]
    return {"ingress": [{"from": peer}], "egress": [{"to": peer}]}


def submitter_patch(policy: dict, address: str) -> dict:
    """The job policy's spec with the submitting machine added (a merge patch replaces lists whole)."""
    spec = policy["spec"]
    extra = submitter_rules(address)
    return {
        "spec": {
            "ingress": list(spec.get("ingress") or []) + extra["ingress"],
            "egress": list(spec.get("egress") or []) + extra["egress"],
        }
    }
