"""The shared-cluster tenant's pure pieces (issue 40): what every rendered pod runs as, what it
asks for, who it acts as, which traffic its NetworkPolicy lets in, and how a policy's refusal reads.

The real admission, RBAC and enforcement are tested on the real node (tests/e2e/k8s/test_tenant.py);
these check each rule on every object mpilaunch renders, for every shape of job."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpilaunch.backends.k8s import network_policy, network_setup, rbac, refusals, resources, security
from mpilaunch.core import env_names
from mpilaunch.core.errors import UsageError
from support.helpers import REPO


def render_objects(tmp_path, *args: str) -> list[dict]:
    """Every object `mpilaunch render` shows for a 4-rank job of 2 workers with ``args``."""
    import yaml

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "render",
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            "tj",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            *args,
            "--",
            "true",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode == 2:
        raise UsageError(proc.stderr.strip(), None)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.load_all(proc.stdout, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]


def pods_of(objects: list[dict]) -> list[tuple[str, dict]]:
    """(role, pod spec) of every pod mpilaunch would make, the Jobs' pod templates included."""
    out = []
    for obj in objects:
        if obj["kind"] == "Pod":
            out.append(("worker", obj["spec"]))
        elif obj["kind"] == "Job":
            out.append((obj["metadata"]["name"].rsplit("-", 1)[-1], obj["spec"]["template"]["spec"]))
    return out


@pytest.mark.parametrize(
    "args",
    [[], ["--launcher", "local"], ["--launcher", "local", "--transport", "agent"], ["--transport", "exec"]],
    ids=["cluster", "local", "local-agent", "exec"],
)
def test_tenant_every_rendered_container_meets_restricted(tmp_path, args):
    pods = pods_of(render_objects(tmp_path, *args))
    assert {role for role, _ in pods} >= {"worker", "reaper"}
    for role, spec in pods:
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, role
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
            assert {e["name"]: e.get("value") for e in c["env"]}.items() >= {"HOME": "/tmp", "TMPDIR": "/tmp"}.items()
            assert {"name": "scratch", "mountPath": "/tmp"} in c["volumeMounts"], role
        assert {"name": "scratch", "emptyDir": {}} in spec["volumes"], role


def test_tenant_run_as_user_forms(tmp_path):
    assert security.parse_run_as("1000650000:0") == security.RunAs(1000650000, 0)
    assert security.parse_run_as("image") == security.RunAs(None, None)
    assert security.parse_run_as("root").root
    image_ctx = security.pod_security_context(security.parse_run_as("image"))
    assert image_ctx == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsNonRoot" not in security.pod_security_context(security.parse_run_as("0"))
    for bad in ("alice", "-1", "1000:x", "99999999999"):
        with pytest.raises(UsageError, match="--run-as-user"):
            security.parse_run_as(bad)
    pods = pods_of(render_objects(tmp_path, "--run-as-user", "1000650000:0", "--read-only-root"))
    for _, spec in pods:
        assert spec["securityContext"]["runAsUser"] == 1000650000 and spec["securityContext"]["runAsGroup"] == 0
        assert all(c["securityContext"]["readOnlyRootFilesystem"] is True for c in spec["containers"])


def test_tenant_bad_run_as_user_is_a_usage_error_before_anything():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--image",
            "i",
            "--run-as-user",
            "alice",
            "--np",
            "2",
            "--",
            "true",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("mpilaunch: error: invalid --run-as-user 'alice'"), result.stderr
    assert "Traceback" not in result.stderr


def test_tenant_service_account_means_no_rbac_objects(tmp_path):
    own = render_objects(tmp_path)
    assert {o["kind"] for o in own} >= {"Role", "RoleBinding", "ServiceAccount"}
    for args in ([], ["--launcher", "local"], ["--transport", "exec"]):
        objs = render_objects(tmp_path, "--service-account", "mpilaunch", *args)
        assert not {o["kind"] for o in objs} & {"Role", "RoleBinding", "ServiceAccount"}, args
        accounts = {role: spec.get("serviceAccountName") for role, spec in pods_of(objs) if role != "worker"}
        assert accounts and set(accounts.values()) == {"mpilaunch"}, accounts


def test_tenant_resources_on_every_container(tmp_path):
    for role, spec in pods_of(render_objects(tmp_path)):
        if role == "worker":
            continue  # no --pod-cpu/--pod-memory: the namespace's LimitRange defaults decide
        for c in spec["containers"]:
            assert c["resources"]["requests"] == c["resources"]["limits"], (role, c["resources"])
    objs = render_objects(
        tmp_path,
        "--launcher-memory",
        "3Gi",
        "--launcher-cpu",
        "2",
        "--reaper-cpu",
        "100m",
        "--pod-cpu",
        "4",
        "--pod-memory",
        "8Gi",
    )
    by_role = {role: spec["containers"][0]["resources"] for role, spec in pods_of(objs)}
    assert by_role["launcher"]["limits"] == {"cpu": "2", "memory": "3Gi"}
    assert by_role["reaper"]["limits"] == {"cpu": "100m", "memory": "128Mi"}
    assert by_role["worker"] == {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "4", "memory": "8Gi"}}
    # sized from the job: one shim per worker with direct spawn
    assert resources.launcher_memory_mib(2) == 320
    assert resources.launcher_memory_mib(1024) == 12544
    with pytest.raises(UsageError, match="--launcher-memory"):
        render_objects(tmp_path, "--launcher-memory", "lots")


def test_tenant_rbac_objects_are_namespaced_and_apply_as_yaml():
    import yaml

    text = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "rbac", "--namespace", "team-a"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding"]
    assert all(d["metadata"]["namespace"] == "team-a" for d in docs)
    assert docs[2]["subjects"] == [{"kind": "ServiceAccount", "name": "mpilaunch", "namespace": "team-a"}]
    verbs = {
        (g, r): set(rule["verbs"]) for rule in docs[1]["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert {"create"} <= verbs[("", "pods/exec")] and verbs[("coordination.k8s.io", "leases")] == {"get"}


def test_tenant_missing_identity_permissions_are_named():
    allowed = {
        ("", "serviceaccounts"): True,
        ("rbac.authorization.k8s.io", "roles"): False,
        ("rbac.authorization.k8s.io", "rolebindings"): False,
    }
    error = rbac.refusal("team-a", rbac.missing_permissions(allowed))
    assert error.message.startswith("you may not create roles, rolebindings in namespace team-a")
    assert "mpilaunch rbac --namespace team-a | kubectl apply -f -" in error.hint
    assert error.exit_code == 2


@pytest.mark.parametrize(
    "message,line",
    [
        (
            'pods "j-worker-1" is forbidden: exceeded quota: compute, requested: limits.cpu=6,requests.cpu=6, '
            "used: limits.cpu=6550m,requests.cpu=6550m, limited: limits.cpu=8,requests.cpu=8",
            "the namespace's ResourceQuota 'compute' is exceeded: requested limits.cpu=6,requests.cpu=6, "
            "already used limits.cpu=6550m,requests.cpu=6550m, limited to limits.cpu=8,requests.cpu=8",
        ),
        (
            'pods "j-worker-0" is forbidden: failed quota: compute: must specify limits.cpu for: worker; '
            "limits.memory for: worker",
            "the namespace's ResourceQuota 'compute' refuses it: must specify limits.cpu for: worker; "
            "limits.memory for: worker",
        ),
        (
            'pods "j-worker-0" is forbidden: minimum cpu usage per Container is 50m, but request is 10m',
            "the namespace's LimitRange refuses it: minimum cpu usage per Container is 50m, but request is 10m",
        ),
        (
            'pods "j-worker-0" is forbidden: [cpu max limit to request ratio per Container is 2, but provided ratio '
            "is 4.000000]",
            "the namespace's LimitRange refuses it: cpu max limit to request ratio per Container is 2, but provided "
            "ratio is 4.000000",
        ),
        (
            'pods "j-worker-0" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true '
            '(pod or container "worker" must set securityContext.runAsNonRoot=true)',
            "the namespace's PodSecurity level restricted:latest refuses it: runAsNonRoot != true (pod or container "
            '"worker" must set securityContext.runAsNonRoot=true)',
        ),
    ],
    ids=["quota-exceeded", "quota-needs-limits", "limitrange-min", "limitrange-ratio", "pod-security"],
)
def test_tenant_policy_refusals_name_the_policy(message, line):
    assert refusals.explain(message)[0] == line
    assert refusals.explain('roles.rbac.authorization.k8s.io is forbidden: User "alice" cannot create') is None


def test_network_policy_open_egress_default_render_keeps_outsiders_out_and_egress_open(tmp_path):
    """--network-policy job (the default), rendered without asking the namespace: one Ingress policy
    (nothing outside the job reaches a worker's agent), no policy with Egress (the pods' egress
    stays as the namespace has it), and a comment saying when the egress allowances are made."""
    objs = render_objects(tmp_path)
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"tj"}
    own = {"podSelector": {"matchLabels": {"mpilaunch/job": "tj"}}}
    assert policies["tj"] == {
        "podSelector": own["podSelector"],
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [own]}],
    }
    assert not [p for p in policies.values() if "Egress" in p["policyTypes"]]
    assert not [o for o in render_objects(tmp_path, "--network-policy", "none") if o["kind"] == "NetworkPolicy"]


def test_network_policy_strict_allows_the_jobs_own_traffic_only(tmp_path):
    """--network-policy strict: what the default was before issue 49 (every pod of the job
    reaches only the job's pods, DNS, and, for the launcher and reaper, the API server)."""
    objs = render_objects(tmp_path, "--network-policy", "strict")
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"tj", "tj-egress", "tj-api"}
    own = {"podSelector": {"matchLabels": {"mpilaunch/job": "tj"}}}
    assert policies["tj"]["ingress"] == [{"from": [own]}] and policies["tj"]["policyTypes"] == ["Ingress"]
    egress = policies["tj-egress"]
    assert egress["podSelector"] == own["podSelector"] and egress["policyTypes"] == ["Egress"]
    assert egress["egress"][0] == {"to": [own]}
    assert {p["port"] for p in egress["egress"][1]["ports"]} == {53, 5353} and "to" not in egress["egress"][1]
    api = policies["tj-api"]
    assert api["podSelector"]["matchExpressions"] == [
        {"key": "mpilaunch/role", "operator": "In", "values": ["launcher", "reaper"]}
    ]
    assert api["policyTypes"] == ["Egress"] and "ingress" not in api


def test_network_policy_open_egress_selector_semantics():
    match = network_policy.selector_matches
    pod = {"mpilaunch/job": "j", "mpilaunch/role": "worker", "app": "train"}
    assert match({}, pod) and match(None, pod)
    assert match({"matchLabels": {"app": "train"}}, pod) and not match({"matchLabels": {"app": "x"}}, pod)
    expressions = [
        ({"key": "app", "operator": "In", "values": ["train", "x"]}, True),
        ({"key": "app", "operator": "In", "values": ["x"]}, False),
        ({"key": "app", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "tier", "operator": "NotIn", "values": ["x"]}, True),  # absent: NotIn selects
        ({"key": "app", "operator": "NotIn", "values": ["train"]}, False),
        ({"key": "app", "operator": "Exists"}, True),
        ({"key": "tier", "operator": "Exists"}, False),
        ({"key": "tier", "operator": "DoesNotExist"}, True),
        ({"key": "app", "operator": "DoesNotExist"}, False),
    ]
    for expression, want in expressions:
        assert match({"matchExpressions": [expression]}, pod) is want, expression
    both = {"matchLabels": {"app": "train"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert not match(both, pod)


def _policy(name: str, selector: dict, types: list[str] | None, **spec) -> dict:
    body = {"podSelector": selector, **spec}
    if types is not None:
        body["policyTypes"] = types
    return {"metadata": {"name": name, "labels": spec.pop("labels", {})}, "spec": body}


JOB_PODS = [
    {"mpilaunch/job": "j", "mpilaunch/role": "worker", "app": "gpu"},
    {"mpilaunch/job": "j", "mpilaunch/role": "worker", "app": "gpu"},
    {"mpilaunch/job": "j", "mpilaunch/role": "launcher"},
    {"mpilaunch/job": "j", "mpilaunch/role": "reaper"},
]


@pytest.mark.parametrize(
    "policies, isolated",
    [
        ([], []),  # a namespace without policies: nothing is isolated, egress stays open
        ([_policy("deny-ingress", {}, ["Ingress"])], []),  # ingress-only default deny: egress open
        ([_policy("deny-all", {}, ["Ingress", "Egress"])], ["launcher", "reaper", "worker"]),
        ([_policy("deny-egress", {}, ["Egress"])], ["launcher", "reaper", "worker"]),
        # an allow-all egress policy isolates too (adding to it is harmless)
        ([_policy("open", {}, ["Egress"], egress=[{}])], ["launcher", "reaper", "worker"]),
        # policyTypes left out: Egress where there is an egress section
        ([_policy("old-style", {}, None, egress=[{"to": []}])], ["launcher", "reaper", "worker"]),
        ([_policy("old-style-ingress", {}, None, ingress=[{}])], []),
        # only the pods a --pod-template labelled app: gpu (the workers)
        ([_policy("gpu", {"matchLabels": {"app": "gpu"}}, ["Egress"])], ["worker"]),
        ([_policy("other", {"matchLabels": {"app": "web"}}, ["Ingress", "Egress"])], []),
        # the job's own policies (labelled with it) are not the namespace's
        ([_policy("j-egress", {"matchLabels": {"mpilaunch/job": "j"}}, ["Egress"], labels={"mpilaunch/job": "j"})], []),
    ],
    ids=[
        "none",
        "deny-ingress",
        "deny-all",
        "deny-egress",
        "allow-all-egress",
        "no-types-egress",
        "no-types-ingress",
        "gpu-only",
        "unrelated",
        "own-policy",
    ],
)
def test_network_policy_open_egress_isolated_roles_from_the_namespaces_policies(policies, isolated):
    assert network_policy.egress_isolated_roles(policies, JOB_PODS, "j") == isolated


def test_network_policy_open_egress_plan():
    plan = network_policy.plan
    assert plan("none", None) is None and plan("none", ["worker"]) is None
    assert plan("strict", None) == {"mode": "strict", "egress_roles": None, "api_roles": ["launcher", "reaper"]}
    assert plan("strict", []) == plan("strict", None)  # strict never asks the namespace
    assert plan("job", None) == {"mode": "job", "egress_roles": [], "api_roles": [], "asked": False}
    assert plan("job", []) == {"mode": "job", "egress_roles": [], "api_roles": [], "asked": True}
    full = plan("job", ["worker", "reaper", "launcher"])
    assert full["egress_roles"] == ["launcher", "reaper", "worker"] and full["api_roles"] == ["launcher", "reaper"]
    assert plan("job", ["worker"])["api_roles"] == []  # the launcher's egress is open: nothing to add


def _backend(tmp_path, *args):
    from support.k8s_render import rendered_backend

    return rendered_backend(tmp_path, *args)


@pytest.mark.parametrize(
    "mode, isolated",
    [
        ("job", []),
        ("job", ["worker"]),
        ("job", ["launcher", "worker"]),
        ("job", ["launcher", "reaper", "worker"]),
        ("strict", None),
    ],
)
def test_network_policy_open_egress_only_the_isolated_roles_get_egress_policies(tmp_path, mode, isolated):
    """What the job's policies do to each of its pods, on the rendered objects: every pod is
    isolated for ingress (only the job's pods may connect); a pod is isolated for egress by the
    job's policies only where the namespace isolated it already (or under strict), and then
    reaches the job's pods and DNS, and the API server if it is the launcher or the reaper."""
    from mpilaunch.backends.k8s import manifests

    backend = _backend(tmp_path, "--network-policy", mode)
    backend.egress_isolated_roles = isolated
    policies = [obj for _, obj in manifests.network_policies(backend)]
    pods = network_policy.pod_labels(backend.objects())
    assert {p["mpilaunch/role"] for p in pods} == {"launcher", "reaper", "worker"}
    # the Job controller's labels on the launcher's and the reaper's pods (a policy may select by them)
    assert {p.get("batch.kubernetes.io/job-name") for p in pods} >= {"j-launcher", "j-reaper"}
    for pod in pods:
        role = pod["mpilaunch/role"]
        selecting = [p for p in policies if network_policy.selector_matches(p["spec"]["podSelector"], pod)]
        ingress = [p for p in selecting if "Ingress" in p["spec"]["policyTypes"]]
        egress = [p for p in selecting if "Egress" in p["spec"]["policyTypes"]]
        assert [p["metadata"]["name"] for p in ingress] == ["j"]
        assert ingress[0]["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"mpilaunch/job": "j"}}}]}]
        should = mode == "strict" or role in isolated
        assert bool(egress) is should, (role, [p["metadata"]["name"] for p in egress])
        if should:
            rules = [rule for p in egress for rule in p["spec"]["egress"]]
            assert {"to": [{"podSelector": {"matchLabels": {"mpilaunch/job": "j"}}}]} in rules
            ports = {port["port"] for rule in rules for port in rule.get("ports", [])}
            assert {53, 5353} <= ports
            assert ({443, 6443} <= ports) is (role in ("launcher", "reaper")), (role, ports)
    # the same policies, in creation order, among the job's objects
    assert [o for g, o in backend.objects() if o["kind"] == "NetworkPolicy"] == policies


def test_network_policy_open_egress_asks_the_namespace_and_a_refusal_names_strict(tmp_path):
    from mpilaunch.backends.k8s.api import ApiError

    backend = _backend(tmp_path)

    class Listing:
        def __init__(self, answer):
            self.answer = answer

        def get(self, api_version, plural, name=None, **kw):
            assert (api_version, plural, name) == ("networking.k8s.io/v1", "networkpolicies", None)
            if isinstance(self.answer, Exception):
                raise self.answer
            return {"items": self.answer}

    objects = backend.objects()

    def isolated(api):
        return network_setup.egress_isolated_roles(api, "ns", objects, "j")

    assert isolated(Listing([_policy("deny-all", {}, ["Ingress", "Egress"])])) == ["launcher", "reaper", "worker"]
    assert isolated(Listing([])) == []
    with pytest.raises(UsageError) as refused:
        isolated(Listing(ApiError(403, "Forbidden", "networkpolicies.networking.k8s.io is forbidden")))
    assert "may not list NetworkPolicies" in str(refused.value) and "--network-policy strict" in refused.value.hint


def test_network_policy_api_ports():
    """By port, to any address (the API server is no pod; its endpoints move): 443, 6443, 8443 (issue
    49: an API server on 8443 was blocked), the kubeconfig's port, and the endpoints' where readable."""
    assert [p["port"] for p in network_policy.api_ports("https://10.0.0.1:36443")] == [443, 6443, 8443, 36443]
    assert [p["port"] for p in network_policy.api_ports(None)] == [443, 6443, 8443]
    endpoints = {"subsets": [{"addresses": [{"ip": "10.0.0.2"}], "ports": [{"port": 9443, "protocol": "TCP"}]}]}
    assert [p["port"] for p in network_policy.api_ports(None, endpoints)] == [443, 6443, 8443, 9443]


def test_tenant_pods_opt_out_of_mesh_sidecars_unless_kept(tmp_path):
    def annotations(objs):
        for obj in objs:
            if obj["kind"] in ("Pod", "Job"):
                meta = obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]
                yield meta.get("annotations") or {}

    def mesh_env(objs) -> dict[str, bool]:
        return {
            role: any(
                e["name"] == env_names.MESH_SIDECARS and e.get("value") == "1"
                for c in spec["containers"]
                for e in c["env"]
            )
            for role, spec in pods_of(objs)
        }

    opted_out = render_objects(tmp_path)
    for a in annotations(opted_out):
        assert a["sidecar.istio.io/inject"] == "false" and a["linkerd.io/inject"] == "disabled"
    assert not any(mesh_env(opted_out).values())
    # kept: injected where the mesh wants, linkerd's proxy lets the Job pods end it, and those pods ask it to
    kept = render_objects(tmp_path, "--mesh-injection")
    for a in annotations(kept):
        assert "sidecar.istio.io/inject" not in a and a["config.linkerd.io/proxy-admin-shutdown"] == "enabled"
    assert mesh_env(kept) == {"worker": False, "launcher": True, "reaper": True}


def test_tenant_launcher_and_reaper_are_not_pinned_to_the_workers_gpu_nodes(tmp_path):
    gpu_nodes = ("--node-selector", "gpu=yes", "--toleration", "nvidia.com/gpu:NoSchedule")
    specs = dict(pods_of(render_objects(tmp_path, *gpu_nodes)))
    assert specs["worker"]["nodeSelector"] == {"gpu": "yes"} and specs["worker"]["tolerations"]
    for role in ("launcher", "reaper"):
        assert "nodeSelector" not in specs[role] and "tolerations" not in specs[role], role


def test_tenant_launcher_placement_is_its_own_when_asked(tmp_path):
    objs = render_objects(
        tmp_path,
        "--node-selector",
        "gpu=yes",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--launcher-node-selector",
        "pool=cpu",
        "--launcher-toleration",
        "pool=cpu:NoSchedule",
    )
    specs = dict(pods_of(objs))
    assert specs["worker"]["nodeSelector"] == {"gpu": "yes"}
    for role in ("launcher", "reaper"):
        assert specs[role]["nodeSelector"] == {"pool": "cpu"}, role
        assert specs[role]["tolerations"] == [
            {"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
        ], role


def test_tenant_admission_is_asked_about_one_pod_of_each_kind(tmp_path):
    """Before anything is created, one worker and the launcher's and reaper's pods (from their Jobs'
    templates) go to admission as dry runs: PodSecurity, LimitRange and quota answer for them."""
    objs = render_objects(tmp_path)
    groups = {"Pod": "workers", "Job": None}
    grouped = [
        (
            groups["Pod"]
            if o["kind"] == "Pod"
            else ("launcher" if o["metadata"]["name"].endswith("-launcher") else "reaper"),
            o,
        )
        for o in objs
        if o["kind"] in ("Pod", "Job")
    ]
    pods = refusals.dry_run_pods(grouped)
    assert [p["metadata"]["name"] for p in pods] == ["tj-reaper-check", "tj-worker-0", "tj-launcher-check"]
    assert all(p["kind"] == "Pod" and p["spec"]["securityContext"]["runAsNonRoot"] for p in pods)


def test_tenant_an_unplaceable_launcher_is_told_how_to_place_it():
    from mpilaunch.backends.k8s.pods import launcher_placement_hint

    scheduler = (
        "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    )
    assert "--launcher-toleration" in launcher_placement_hint(scheduler)
    assert launcher_placement_hint("0/3 nodes are available: 3 Insufficient cpu.") == ""
    assert launcher_placement_hint(None) == ""
