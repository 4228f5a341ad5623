"""The job's NetworkPolicies (``--network-policy job|strict``): what they open and close (pure).

NetworkPolicies are allow-lists that add up: a pod selected by no policy of a
direction is open in that direction; once one policy selects it for Ingress
(or Egress), it is isolated in that direction and only the union of every
such policy's rules is allowed. So a policy can only take traffic away from a
pod that was open, and only add traffic to a pod that was isolated already.

* ``<job>`` (Ingress; ``job`` and ``strict``): every pod of the job accepts
  connections from the job's pods only (and, with ``--launcher local
  --transport agent``, the submitting side on the agent's port): nothing outside the job reaches a worker's agent or
  the ports the MPI daemons and ranks listen on. Taking this away from an
  open namespace is the point of it.
* ``<job>-egress`` (Egress: the job's pods, DNS, mpirun on the submitting side) and
  ``<job>-api`` (Egress: the API server, for the launcher and the reaper):
  under ``strict``, for every pod of the job (they then reach nothing else).
  Under ``job`` (the default), only for the roles whose pods the
  namespace's own policies isolate for egress already
  (:func:`egress_isolated_roles`): there they only add what the job needs to
  what the namespace allows; where the namespace leaves egress open they are
  not made, and the job's pods reach what any pod of the namespace reaches
  (object stores, model hubs, package mirrors, other namespaces' Services).

Their DNS rule names the cluster DNS's own pods where mpilaunch may read its
Service (:func:`dns_rules`), else the DNS ports to any address; the API rule
is by port (:func:`api_ports` says why).

With ``--launcher local`` the submitting side talks to the pods too: its
address is known once the pods have theirs (the source address of the route
to them), so it is added then, for exactly what the launch needs
(:func:`submitter_rules`; ``network_setup.let_in_submitter``).

NetworkPolicies are evaluated after a Service's DNAT on every common
enforcer, so the API server is allowed by its endpoint's port, not by the
``kubernetes`` Service's address (which a tenant may not read): 443, 6443,
8443 and the port of the kubeconfig's server.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .pods import JOB_LABEL, ROLE_LABEL

# 8443: the API server's own port on minikube, OpenShift's and several managed clusters' endpoints
DEFAULT_API_PORTS = (443, 6443, 8443)
ROLES = ("launcher", "reaper", "worker")  # every pod's mpilaunch/role
API_ROLES = ("launcher", "reaper")  # the pods that talk to the API server
# DNS, wherever the cluster serves it (53; OpenShift's DNS pods listen on 5353)
DNS_PORTS = [{"protocol": proto, "port": port} for port in (53, 5353) for proto in ("UDP", "TCP")]
# The cluster DNS Services that select their pods by labels: (namespace, name), the first found counts
DNS_SERVICES = (("kube-system", "kube-dns"), ("openshift-dns", "dns-default"))
# NodeLocal DNSCache: its pods' labels and the link-local address it listens on (its default)
NODE_LOCAL_DNS = ({"k8s-app": "node-local-dns"}, "169.254.20.10")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # every namespace has it (Kubernetes 1.21+)


def host_cidr(address: str) -> str:
    return f"{address}/{128 if ':' in address else 32}"


def api_ports(server: str | None, endpoints: dict | None = None) -> list[dict]:
    """The ports the launcher and reaper reach the API server on: 443, 6443, 8443, the kubeconfig's
    ``server`` port, and the ports of the ``kubernetes`` Service's endpoints where the caller may
    read them (``endpoints``: ``default/endpoints/kubernetes``). By port only, to any address: the
    API server is no pod a selector could name, its endpoint addresses are hidden from a tenant and
    move when a managed control plane is upgraded, and a launcher cut off from them mid-job would
    lose the job."""
    ports = set(DEFAULT_API_PORTS)
    if server:
        try:
            port = urlsplit(server).port
        except ValueError:
            port = None
        if port:
            ports.add(port)
    for subset in (endpoints or {}).get("subsets") or []:
        ports.update(
            p["port"] for p in subset.get("ports") or [] if p.get("protocol", "TCP") == "TCP" and p.get("port")
        )
    return [{"protocol": "TCP", "port": p} for p in sorted(ports)]


def dns_rules(service: dict | None) -> list[dict]:
    """The egress rules for name lookups. ``service``: the cluster's DNS Service (``DNS_SERVICES``)
    where the caller may read it; then only its pods (by its selector, in its namespace), its
    cluster IPs (enforcers that match before the Service's DNAT; NodeLocal DNSCache in iptables mode
    answers on them), and NodeLocal DNSCache's pods and address. Else (a tenant may not read
    kube-system; a DNS that is no selected pod, as on the testbed) the DNS ports to any address."""
    spec = (service or {}).get("spec") or {}
    selector = spec.get("selector")
    if not selector:
        return [{"ports": DNS_PORTS}]
    namespace = service["metadata"]["namespace"]
    node_local_labels, node_local_ip = NODE_LOCAL_DNS
    peers = [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
            "podSelector": {"matchLabels": selector},
        },
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "kube-system"}},
            "podSelector": {"matchLabels": node_local_labels},
        },
    ]
    ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
    peers += [{"ipBlock": {"cidr": host_cidr(ip)}} for ip in ips if ip and ip != "None"]
    peers.append({"ipBlock": {"cidr": host_cidr(node_local_ip)}})
    return [{"to": peers, "ports": DNS_PORTS}]


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


def job_controller_labels(name: str) -> dict:
    """What the Job controller adds to its pods' labels (a namespace policy may select Jobs' pods by
    them); the uid is not known before the Job is made: it matches ``Exists``, never a value."""
    uid = "<uid of the Job>"
    return {
        "job-name": name,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "batch.kubernetes.io/controller-uid": uid,
    }


def pod_labels(objects) -> list[dict]:
    """The labels of every pod the job's objects make: Pods, and the pod templates of Jobs (with
    what the Job controller adds)."""
    out = []
    for _group, obj in objects:
        if obj.get("kind") == "Pod":
            out.append((obj.get("metadata") or {}).get("labels") or {})
        elif isinstance((obj.get("spec") or {}).get("template"), dict):
            labels = (obj["spec"]["template"].get("metadata") or {}).get("labels") or {}
            extra = job_controller_labels(obj["metadata"]["name"]) if obj.get("kind") == "Job" else {}
            out.append({**extra, **labels})
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


# ------------------------------------------------------------------ the submitting machine (--launcher local)


def submitter_peer(address: str, pod: dict | None = None) -> dict:
    """The submitting side as a NetworkPolicy peer. A pod (mpilaunch run inside the cluster:
    ``pod`` is its own Pod object) is named by its labels in its namespace: an ``ipBlock`` is for
    addresses outside the cluster, and several enforcers (Cilium) never match a pod's IP with one.
    A machine outside the pod network, a node, a host-network or unlabelled pod: its address."""
    meta, spec, status = (
        (pod or {}).get("metadata") or {},
        (pod or {}).get("spec") or {},
        (pod or {}).get("status") or {},
    )
    if meta.get("labels") and not spec.get("hostNetwork") and status.get("podIP") == address:
        return {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: meta["namespace"]}},
            "podSelector": {"matchLabels": dict(meta["labels"])},
        }
    return {"ipBlock": {"cidr": host_cidr(address)}}


def submitter_rules(peer: dict, *, callbacks: bool, agent: bool, agent_port: int) -> dict:
    """What the submitting side needs of the job's pods, and no more: ``callbacks`` (an mpirun
    launch: mpirun's daemons and hydra's proxies connect back to mpirun / mpiexec, which listen on
    ephemeral TCP ports) lets the pods out to it on TCP; ``agent`` (``--transport agent``: its shims
    and the hang probe connect to each worker's agent) lets it in on the agent's port. PS mode
    (its registry reads the task starters over the exec channel) with the exec transport needs
    neither: nothing of the job's ports is opened to the submitting machine."""
    return {
        "ingress": [{"from": [peer], "ports": [{"protocol": "TCP", "port": agent_port}]}] if agent else [],
        "egress": [{"to": [peer], "ports": [{"protocol": "TCP"}]}] if callbacks else [],
    }


def submitter_patch(policy: dict, rules: dict) -> dict | None:
    """A job policy's spec with the submitter's ``rules`` added in the directions it is of (a merge
    patch replaces lists whole), or None where there is nothing to add: a relaunch (``--retries``)
    lets the same machine in again, which must not append the same rule once per attempt."""
    spec = policy["spec"]
    types = spec.get("policyTypes") or ["Ingress"]
    out = {}
    for direction in ("Ingress", "Egress"):
        key = direction.lower()
        have = list(spec.get(key) or [])
        new = [rule for rule in rules.get(key) or [] if rule not in have]
        if direction in types and new:
            out[key] = have + new
    return {"spec": out} if out else None
