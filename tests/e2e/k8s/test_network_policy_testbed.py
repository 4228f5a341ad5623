"""The testbed's NetworkPolicy enforcer really enforces (marker ``real_pods``; issue 40).

The real node runs kube-router's policy controller (``testbeds/k8s/netpol.py``)
beside its kubelet. These tests prove it on real pods with the project's
image, without mpilaunch: a listener pod, client pods that try TCP
connections with short timeouts (one ``kubectl exec`` each, which retries
inside the pod until the expected answer or its deadline), and policies
applied and removed around them:

* with no policy, everything is allowed; a default-deny ingress policy makes a
  connection to the listener fail (kube-router REJECTs: refused at once); a
  policy allowing the client's pods on that port opens it again;
* a namespace without policies is untouched, while its pods cannot reach
  into the denied namespace;
* with default-deny egress, DNS and the API server are cut off, and the
  egress rules ``netpol.py`` documents (the node IP's port 53, the API
  server's DNAT target) let them through, as do port-only rules.

The pods pass PodSecurity ``restricted`` (their namespaces enforce it).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from support.listener import LISTENER, LISTENER_PORT

pytestmark = pytest.mark.real_pods

# argv: HOST PORT WANT(open|closed) SECONDS. Tries until the answer is WANT or SECONDS passed;
# prints the last answer, how long the last try took and when it came.
PROBE = r"""
import json, socket, sys, time
host, port, want, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
t0 = time.monotonic(); tries = 0
while True:
    tries += 1; t = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            got, err = ("open" if s.recv(2) == b"ok" else "closed"), ""
    except OSError as e:
        got, err = "closed", f"{type(e).__name__}: {e}"
    took = time.monotonic() - t
    if got == want or time.monotonic() - t0 > limit:
        print(json.dumps({"result": got, "error": err, "after": round(time.monotonic() - t0, 2),
                          "attempt_s": round(took, 3), "tries": tries}))
        break
    time.sleep(0.2)
"""
# argv: API_PORT WANT(ok|cut) SECONDS. DNS (kubernetes.default through CoreDNS on the node) and
# the API server (the kubernetes Service, DNATed to its loopback port), each tried until its answer
# is WANT or SECONDS passed; each answer "ok" or the error, and when it came.
EGRESS = r"""
import json, socket, ssl, sys, time
want, limit = sys.argv[2], float(sys.argv[3])
def dns():
    return socket.gethostbyname("kubernetes.default.svc.cluster.local")
def api():
    with socket.create_connection(("10.96.0.1", 443), timeout=1.0) as raw:
        ctx = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        with ctx.wrap_socket(raw, server_hostname="kubernetes.default.svc") as tls:
            tls.sendall(b"GET /livez HTTP/1.0\r\nHost: kubernetes.default.svc\r\n\r\n")
            return tls.recv(100).split(b"\r\n")[0].decode()
out = {}
for name, check in (("dns", dns), ("api", api)):
    t0 = time.monotonic()
    while True:
        t = time.monotonic()
        try:
            check(); out[name] = "ok"
        except OSError as e:
            out[name] = f"{type(e).__name__}: {e}"
        out[name + "_try_s"] = round(time.monotonic() - t, 3)
        if (out[name] == "ok") == (want == "ok") or time.monotonic() - t0 > limit:
            break
        time.sleep(0.2)
    out[name + "_s"] = round(time.monotonic() - t0, 2)
print(json.dumps(out))
"""
RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def namespace(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }


def pod(real, name: str, ns: str, app: str, program: str) -> dict:
    from testbeds.k8s.node_config import REAL_KEY

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "nodeSelector": {REAL_KEY: "true"},
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": REAL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "securityContext": RESTRICTED,
            "containers": [
                {
                    "name": "main",
                    "image": real.image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", program],
                    "securityContext": CONTAINER_SECURITY,
                }
            ],
        },
    }


def policy(ns: str, name: str, spec: dict) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


DENY_INGRESS = {"podSelector": {}, "policyTypes": ["Ingress"]}
DENY_ALL = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


class Pods:
    def __init__(self, real, suffix: str):
        self.real = real
        self.a, self.b, self.c = (f"mpl-netpol-{x}-{suffix}" for x in "abc")
        self.ip: dict[str, str] = {}

    def exec(self, ns: str, pod: str, program: str, *args, timeout: float = 60) -> dict:
        p = self.real.kubectl(
            "exec", "-n", ns, pod, "--", "python3", "-c", program, *map(str, args), check=False, timeout=timeout
        )
        assert p.returncode == 0, f"exec in {ns}/{pod} failed: {p.stderr[-500:]}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    def probe(self, ns: str, client: str, server: str, want: str, seconds: float = 15) -> dict:
        return self.exec(ns, client, PROBE, self.ip[server], LISTENER_PORT, want, seconds)

    def apply(self, *objects) -> None:
        self.real.cluster.apply(list(objects))

    def delete_policies(self, ns: str) -> None:
        self.real.kubectl("delete", "networkpolicies", "--all", "-n", ns, "--wait=true")


@pytest.fixture(scope="module")
def pods(real):
    """Namespaces a (listener + client), b (listener + client) and c (client), no policy yet."""
    from testbeds.k8s.netpol import COMPONENT

    assert real.cluster.node.netpol is not None or COMPONENT in real.cluster.pids, (
        "the real node runs no NetworkPolicy enforcer (MPILAUNCH_K8S_NETPOL=0?)"
    )
    t = Pods(real, uuid.uuid4().hex[:6])
    t.apply(namespace(t.a), namespace(t.b), namespace(t.c))
    for ns in (t.a, t.b, t.c):  # pods need the namespace's default ServiceAccount
        deadline = time.monotonic() + 30
        while real.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {ns}"
            time.sleep(0.2)
    sleeper = "import time\nwhile True: time.sleep(3600)"
    t.apply(
        pod(real, "server", t.a, "server", LISTENER),
        pod(real, "client", t.a, "client", sleeper),
        pod(real, "server", t.b, "server", LISTENER),
        pod(real, "client", t.b, "client", sleeper),
        pod(real, "client", t.c, "client", sleeper),
    )
    try:
        for ns in (t.a, t.b, t.c):
            for p in real.cluster.wait_pods(ns, timeout=120):
                t.ip[f"{ns}/{p['metadata']['name']}"] = p["status"]["podIP"]
        yield t
    finally:
        real.kubectl("delete", "namespace", t.a, t.b, t.c, "--wait=false", check=False)


def test_network_policy_default_deny_ingress_refuses_and_an_allow_policy_opens(pods):
    a = pods.a
    server = f"{a}/server"
    # no policy: open
    first = pods.probe(a, "client", server, "open")
    assert first["result"] == "open", first
    t0 = time.monotonic()
    pods.apply(policy(a, "deny-ingress", DENY_INGRESS))
    denied = pods.probe(a, "client", server, "closed")
    denied_after = time.monotonic() - t0
    assert denied["result"] == "closed", f"default-deny ingress did not stop the connection: {denied}"
    # kube-router REJECTs: refused at once, not a timeout
    assert "refused" in denied["error"].lower() and denied["attempt_s"] < 0.5, denied
    # and it stays closed
    again = pods.probe(a, "client", server, "open", seconds=2)
    assert again["result"] == "closed", again

    t1 = time.monotonic()
    pods.apply(
        policy(
            a,
            "allow-client",
            {
                "podSelector": {"matchLabels": {"app": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                        "ports": [{"protocol": "TCP", "port": LISTENER_PORT}],
                    }
                ],
            },
        )
    )
    opened = pods.probe(a, "client", server, "open")
    opened_after = time.monotonic() - t1
    assert opened["result"] == "open", f"the allow policy did not let the client in: {opened}"
    print(
        f"network_policy: denied {denied_after:.2f}s after the policy (refused in {denied['attempt_s']}s: "
        f"{denied['error']}); allowed again {opened_after:.2f}s after the allow policy"
    )
    pods.delete_policies(a)


def test_network_policy_namespace_without_policies_is_untouched_and_cannot_reach_in(pods):
    a, b = pods.a, pods.b
    pods.apply(policy(a, "deny-ingress", DENY_INGRESS))
    try:
        # a's listener is closed to b's client (once the policy is in force) ...
        into_a = pods.probe(b, "client", f"{a}/server", "closed")
        assert into_a["result"] == "closed", into_a
        # ... while b, with no policy, keeps its own traffic, and a's client reaches b's listener
        within_b = pods.probe(b, "client", f"{b}/server", "open", seconds=5)
        assert within_b["result"] == "open", within_b
        a_to_b = pods.probe(a, "client", f"{b}/server", "open", seconds=5)
        assert a_to_b["result"] == "open", a_to_b
    finally:
        pods.delete_policies(a)
    # the policy gone, a is open again
    reopened = pods.probe(b, "client", f"{a}/server", "open")
    assert reopened["result"] == "open", reopened


def test_network_policy_egress_deny_cuts_dns_and_api_server_and_the_documented_rules_allow_them(pods):
    from testbeds.k8s import netpol
    from testbeds.k8s.node_config import gateway

    c = pods.c
    port = pods.real.cluster.ports["kube-apiserver"]
    forms = {  # the exact peers netpol.py documents; any destination on the ports (mpilaunch's job policy)
        "ip_blocks": [{"to": [netpol.dns_peer(gateway())], "ports": netpol.DNS_PORTS}, *netpol.api_server_rules(port)],
        "ports_only": [{"ports": netpol.DNS_PORTS}, {"ports": [{"protocol": "TCP", "port": port}]}],
    }
    pods.apply(policy(c, "deny-all", DENY_ALL))
    try:
        cut = pods.exec(c, "client", EGRESS, port, "cut", 15)
        assert cut["dns"] != "ok" and cut["api"] != "ok", f"default-deny egress left DNS or the API server open: {cut}"
        for form, egress in forms.items():  # the second replaces the first (same name)
            pods.apply(policy(c, "allow-dns-api", {"podSelector": {}, "policyTypes": ["Egress"], "egress": egress}))
            ok = pods.exec(c, "client", EGRESS, port, "ok", 15)
            assert ok["dns"] == "ok" and ok["api"] == "ok", f"{form}: DNS / the API server still cut off: {ok}"
            print(f"network_policy egress: denied {cut}; allowed by {form}: {ok}")
    finally:
        pods.delete_policies(c)
