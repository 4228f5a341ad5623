"""What the job's NetworkPolicies open for the submitting side, the cluster DNS, the API server and
a kept service mesh (issue 49, items 8, 9 and the DNS/API rules).

The backend's own code runs here against a scripted API (the namespace's objects as the API server
returns them; patches applied as a JSON merge patch does): the real API server's side of it is in
``tests/e2e/k8s/test_network_policy_submitter.py`` (kwok) and the enforcement on real pods in
``tests/e2e/k8s/test_network_policy_job.py`` and ``test_tenant.py``.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from mpilaunch.backends.k8s import network_policy
from mpilaunch.backends.k8s.api import ApiError
from support.helpers import REPO
from support.k8s_render import rendered_backend

NP = "networking.k8s.io/v1"
OWN = {"podSelector": {"matchLabels": {"mpilaunch/job": "j"}}}


class ScriptedApi:
    """The objects of a cluster by (plural, namespace, name); ``get`` of a missing one is a 404, of
    a forbidden plural a 403; ``patch`` merges ``spec`` as a JSON merge patch does (lists whole)."""

    def __init__(self, objects: dict, forbidden: tuple[str, ...] = ()):
        self.objects = copy.deepcopy(objects)
        self.forbidden = forbidden
        self.patches: list[tuple[str, dict]] = []

    def get(self, api_version, plural, name=None, namespace="", **query):
        if plural in self.forbidden:
            raise ApiError(403, "Forbidden", f"{plural} is forbidden")
        if name is None:
            return {"items": [o for (p, ns, _), o in self.objects.items() if p == plural and ns == (namespace or "ns")]}
        try:
            return copy.deepcopy(self.objects[(plural, namespace or "ns", name)])
        except KeyError:
            raise ApiError(404, "NotFound", f"{plural} {name} not found") from None

    def patch(self, api_version, plural, name, body):
        self.patches.append((name, copy.deepcopy(body)))
        self.objects[(plural, "ns", name)]["spec"].update(copy.deepcopy(body["spec"]))


def backend_for(tmp_path, *args, mode: str = "mpi"):
    return rendered_backend(tmp_path, "--namespace", "ns", *args, mode=mode, command=("python3", "t.py"))


def job_policies(backend) -> dict:
    """The job's policies as ``allocate`` made them (strict: ingress, egress, api), in the API."""
    made = {}
    for _, obj in backend.objects():
        if obj["kind"] == "NetworkPolicy":
            made[("networkpolicies", "ns", obj["metadata"]["name"])] = obj
            backend.created.append((NP, "networkpolicies", obj["metadata"]["name"]))
    return made


def let_in(tmp_path, *args, mode="mpi", own_pod=None, times=1):
    """The submitting side let into a running job's strict policies ``times`` times (a relaunch
    does it again); the policies as the API then holds them, and the patches sent."""
    backend = backend_for(tmp_path, "--launcher", "local", "--network-policy", "strict", *args, mode=mode)
    objects = job_policies(backend)
    if own_pod is not None:
        objects[("pods", "tools", "submitter")] = own_pod
    backend._api = ScriptedApi(objects)
    backend.pods = {backend.plan.workers[0].name: {"status": {"podIP": "127.0.0.1"}}}
    for _ in range(times):
        backend._let_in_submitter()
    return {name: backend._api.objects[("networkpolicies", "ns", name)]["spec"] for name in ("j", "j-egress")}, (
        backend._api.patches
    )


PEER = {"ipBlock": {"cidr": "127.0.0.1/32"}}
INGRESS_FROM_JOB = [{"from": [OWN]}]


@pytest.mark.parametrize(
    "mode, transport, ingress, egress",
    [
        # mpirun here, its daemons in the pods over the exec API: they connect back to mpirun (TCP,
        # ephemeral ports); nothing connects in
        ("mpi", "exec", [], [{"to": [PEER], "ports": [{"protocol": "TCP"}]}]),
        # ... with --transport agent the shims here connect to each worker's agent: that port only
        (
            "mpi",
            "agent",
            [{"from": [PEER], "ports": [{"protocol": "TCP", "port": 7355}]}],
            [{"to": [PEER], "ports": [{"protocol": "TCP"}]}],
        ),
        ("ps", "exec", [], []),  # PS mode: the registry reads the starters over the exec API; nothing
        ("ps", "agent", [{"from": [PEER], "ports": [{"protocol": "TCP", "port": 7355}]}], []),
    ],
)
def test_network_policy_submitter_rule_opens_only_what_the_launch_needs(tmp_path, mode, transport, ingress, egress):
    """Issue 49 item 9: the submitter rule opened every port both ways to the submitting host (TF
    gRPC, c10d, gloo rendezvous open to every user of a login node), PS mode included."""
    specs, patches = let_in(tmp_path, "--transport", transport, mode=mode)
    assert specs["j"]["ingress"] == INGRESS_FROM_JOB + ingress
    assert specs["j-egress"]["egress"][2:] == egress  # after the job's own pods and DNS
    assert "egress" not in specs["j"] and "ingress" not in specs["j-egress"]
    assert len(patches) == bool(ingress) + bool(egress)  # nothing to add: no patch at all


def test_network_policy_submitter_patch_on_every_retry_adds_the_rule_once(tmp_path):
    """Issue 49 item 9: every relaunch (--retries) let the same machine in again, appending the
    same rule to the policies once per attempt."""
    once, _ = let_in(tmp_path, "--transport", "agent", times=1)
    thrice, patches = let_in(tmp_path, "--transport", "agent", times=3)
    assert thrice == once
    assert [name for name, _ in patches] == ["j", "j-egress"]  # the first attempt's, none after
    # the pure part: a policy that has the rule already gets no patch
    rules = network_policy.submitter_rules(PEER, callbacks=True, agent=True, agent_port=7355)
    policy = {"spec": {"policyTypes": ["Ingress"], "ingress": INGRESS_FROM_JOB + rules["ingress"]}}
    assert network_policy.submitter_patch(policy, rules) is None


def test_network_policy_submitter_in_cluster_pod_is_selected_by_labels(tmp_path, monkeypatch):
    """Issue 49 item 9: mpilaunch run inside a pod (--launcher local) is named by its own pod's labels
    in its namespace: an ipBlock is for addresses outside the cluster (Cilium never matches a pod IP
    with one). A host-network pod, one without labels or not this address: its address."""
    from mpilaunch.backends.k8s import network_setup

    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("tools\n")
    monkeypatch.setattr(network_setup, "POD_NAMESPACE_FILE", str(namespace_file))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv(network_setup.POD_NAME_ENV, "submitter")
    pod = {
        "metadata": {"name": "submitter", "namespace": "tools", "labels": {"app": "notebook", "user": "alice"}},
        "spec": {},
        "status": {"podIP": "127.0.0.1"},
    }
    specs, _ = let_in(tmp_path, mode="mpi", own_pod=pod)
    peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}},
        "podSelector": {"matchLabels": {"app": "notebook", "user": "alice"}},
    }
    assert specs["j-egress"]["egress"][2:] == [{"to": [peer], "ports": [{"protocol": "TCP"}]}]
    for other in (
        {**pod, "spec": {"hostNetwork": True}},
        {**pod, "metadata": {**pod["metadata"], "labels": {}}},
        {**pod, "status": {"podIP": "10.0.0.9"}},
    ):
        assert network_policy.submitter_peer("127.0.0.1", other) == PEER
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")  # outside the cluster: no pod is asked for
    specs, _ = let_in(tmp_path / "outside", mode="mpi", own_pod=pod)
    assert specs["j-egress"]["egress"][2:] == [{"to": [PEER], "ports": [{"protocol": "TCP"}]}]


KUBE_DNS = {
    "metadata": {"name": "kube-dns", "namespace": "kube-system"},
    "spec": {"selector": {"k8s-app": "kube-dns"}, "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]},
}


def dns_and_api_rules(tmp_path, api: ScriptedApi, *args) -> tuple[list, list]:
    """The DNS rule of <job>-egress and the rules of <job>-api as ``allocate`` makes them."""
    from mpilaunch.backends.k8s import network_setup

    backend = backend_for(tmp_path, "--network-policy", "strict", *args)
    backend._api = api
    objects = network_setup.with_policies(backend, backend.objects(), lambda objects: None)
    policies = {o["metadata"]["name"]: o["spec"] for _, o in objects if o["kind"] == "NetworkPolicy"}
    return policies["j-egress"]["egress"][1:], policies["j-api"]["egress"]


def test_network_policy_dns_rule_selects_kube_dns_where_it_can_be_found(tmp_path):
    """Issue 49 (low): the DNS rule let the job's pods reach any address on 53 and 5353. Where the
    cluster DNS's Service can be read, only its pods (and its cluster IP, NodeLocal DNSCache)."""
    found, _ = dns_and_api_rules(tmp_path, ScriptedApi({("services", "kube-system", "kube-dns"): KUBE_DNS}))
    assert len(found) == 1 and {p["port"] for p in found[0]["ports"]} == {53, 5353}
    assert found[0]["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        },
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "node-local-dns"}},
        },
        {"ipBlock": {"cidr": "10.96.0.10/32"}},
        {"ipBlock": {"cidr": "169.254.20.10/32"}},
    ]
    # a tenant may not read kube-system (or the DNS is no pod, as on the testbed): by port, anywhere
    for api in (ScriptedApi({}, forbidden=("services", "endpoints")), ScriptedApi({})):
        fallback, _ = dns_and_api_rules(tmp_path, api)
        assert fallback == [{"ports": network_policy.DNS_PORTS}]
    openshift = {**KUBE_DNS, "metadata": {"name": "dns-default", "namespace": "openshift-dns"}}
    openshift["spec"] = {**KUBE_DNS["spec"], "selector": {"dns.operator.openshift.io/daemonset-dns": "default"}}
    found, _ = dns_and_api_rules(tmp_path, ScriptedApi({("services", "openshift-dns", "dns-default"): openshift}))
    assert found[0]["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "openshift-dns"}


def test_network_policy_api_server_on_8443_is_reached(tmp_path):
    """Issue 49 (low): an API server whose endpoint listens on 8443 (minikube, several managed
    clusters) was cut off from the launcher and reaper (443, 6443 and the kubeconfig's port only)."""
    assert [p["port"] for p in network_policy.api_ports("https://10.0.0.1:36443")] == [443, 6443, 8443, 36443]
    _, api_rules = dns_and_api_rules(tmp_path, ScriptedApi({}, forbidden=("services", "endpoints")))
    assert api_rules == [{"ports": [{"protocol": "TCP", "port": p} for p in (443, 6443, 8443)]}]
    endpoints = {"subsets": [{"addresses": [{"ip": "10.0.0.2"}], "ports": [{"port": 9443, "protocol": "TCP"}]}]}
    _, api_rules = dns_and_api_rules(tmp_path, ScriptedApi({("endpoints", "default", "kubernetes"): endpoints}))
    assert [p["port"] for p in api_rules[0]["ports"]] == [443, 6443, 8443, 9443]


def render(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mpilaunch", "render", "--backend", "k8s", "--image", "img", "--name", "tj"]
    return subprocess.run(
        [*cmd, "--np", "2", *args, "--", "true"], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_mesh_injection_default_policy_leaves_the_proxies_way_to_their_control_plane():
    """Issue 49 item 8: with --mesh-injection the default policy cut the proxies off from their
    control plane (istiod, linkerd's destination): now it takes no egress (an ingress policy only),
    and where the namespace isolates egress its own policies must allow the mesh already."""
    import yaml

    proc = render("--mesh-injection")
    assert proc.returncode == 0, proc.stderr
    policies = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "NetworkPolicy"]
    assert [(p["metadata"]["name"], p["spec"]["policyTypes"]) for p in policies] == [("tj", ["Ingress"])]


def test_mesh_injection_with_strict_policy_is_refused_in_one_line():
    """Issue 49 item 8: strict would cut a kept mesh's proxies off; refused before anything, exit 2."""
    proc = render("--mesh-injection", "--network-policy", "strict")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        "mpilaunch: error: --mesh-injection with --network-policy strict: "
        "the mesh's proxies could not reach their control plane"
    ), proc.stderr
    assert len(lines) == 2 and "--network-policy none" in lines[1] and not proc.stdout


def test_network_policy_open_egress_sees_a_policy_on_the_job_controllers_labels(tmp_path):
    """A namespace policy that isolates every Job's pods (by the label the Job controller adds) isolates
    the launcher's: it gets the job's API allowance, though the rendered template has no such label."""
    backend = backend_for(tmp_path)
    jobs_only = {
        "metadata": {"name": "deny-jobs"},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": "batch.kubernetes.io/job-name", "operator": "Exists"}]},
            "policyTypes": ["Egress"],
        },
    }
    labels = network_policy.pod_labels(backend.objects())
    roles = network_policy.egress_isolated_roles([jobs_only], labels, "j")
    assert "launcher" in roles and "worker" not in roles
    assert network_policy.plan("job", roles)["api_roles"] == [r for r in ("launcher", "reaper") if r in roles]
