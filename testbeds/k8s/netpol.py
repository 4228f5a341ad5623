"""A real NetworkPolicy enforcer for the testbed's real node: kube-router's
policy controller (built by ``build.sh`` in the testbed's one Go build), started with the node
like the kubelet.

Why kube-router (testbeds/k8s/README.md, "NetworkPolicy", has the numbers):
``sigs.k8s.io/kube-network-policies`` v0.8.0 (the newest the Go proxy serves
us) decides every new connection in user space through nftables' ``queue``
statement, and this machine's kernel has no CONFIG_NFT_QUEUE (``nft add rule
... queue num 100`` fails with "No such file or directory"); its only iptables
path was removed after v0.1.0. kube-router's controller needs iptables
(nft-compat here) with ipset/xt_set, conntrack, physdev and br_netfilter,
which this kernel has. It runs alone (``--run-firewall``; no router, no
service proxy), as a host process with a client certificate bound to the
ClusterRole below.

How it sees pod traffic: pods are on the Linux bridge ``mplpods0``; bridged
pod-to-pod frames reach iptables' FORWARD chain only with br_netfilter and
``net.bridge.bridge-nf-call-iptables=1`` (set here when it is not, and put
back on stop). kube-router jumps from INPUT/FORWARD/OUTPUT to its chains and
gives every pod of this node (``status.hostIP`` = the node IP) a firewall
chain. A namespace with no NetworkPolicy selecting a pod allows everything,
as on any cluster. Its rules, chains and ipsets are removed on stop (and
before start: a run killed before its stop leaves them behind).

What a policy must allow on this testbed (measured, kube-router v2.1.0):

* **DNS**: CoreDNS is a host process on the node IP (the bridge gateway,
  ``10.233.0.1`` with the default subnet). An egress rule
  ``to: [{ipBlock: {cidr: 10.233.0.1/32}}]`` with ports UDP 53 and TCP 53.
  A ``namespaceSelector``/``podSelector`` peer does not match it: it is not
  a pod. (``DNS_PEER``/``DNS_PORTS`` below.)
* **The API server**: pods dial ``10.96.0.1:443`` (the ``kubernetes``
  Service), which the node DNATs in PREROUTING to the API server on
  ``127.0.0.1:<port>`` (``node_config.dnat_rule``). kube-router filters after the
  DNAT (INPUT chain), like every iptables enforcer behind kube-proxy, so
  the rule must name the translated address: ``to: [{ipBlock: {cidr:
  127.0.0.1/32}}]`` with TCP port = the API server's port
  (``KubeCluster.ports["kube-apiserver"]``, the port of the kubeconfig's
  ``server`` URL; it changes with every cluster). ``10.96.0.1/32`` port 443
  alone is NOT enough here (kube-router's own "allow traffic to cluster IP
  range" rule matches the post-DNAT destination too, so it never fires for
  this route). A policy meant for real clusters as well lists both:
  the Service IP:443 (enforcers that match before the DNAT) and the
  endpoint (``kubectl get endpointslices -n default -l
  kubernetes.io/service-name=kubernetes``; on this testbed, which publishes
  no endpoint for a loopback API server, 127.0.0.1:<port>).
  ``api_server_peer()`` gives both. The API server's port must lie outside
  the NodePort range (30000-32767): kube-router RETURNs any TCP to a local
  address on those ports before the pod chains ("allow LOCAL TCP traffic
  to node ports"), so no egress policy could cut it (``testbeds/ports.py``).
* **The node itself** (``--launcher local`` runs on the host and connects to
  the pods from the node IP): kube-router's pod chains let in traffic whose
  source is a local address ("permit traffic to pods when source is the
  pod's local node", ``-m addrtype --src-type LOCAL``, for kubelet probes),
  so ingress from the host is not blocked (read in its source, not measured
  here); egress from a pod to the host (other than DNS / the API server)
  needs an ipBlock for the node IP, or a port-only rule.
* Pod-to-pod traffic (the same bridge) is what policies select as usual:
  ``podSelector`` / ``namespaceSelector`` peers and ports.

Latency: kube-router re-syncs on every pod, namespace or policy event; a
new policy, or a new pod's IP, is enforced after that sync (about a second
here). A pod's traffic is not intercepted before kube-router has seen its IP
(fail open for that moment), as on any kube-router cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

BUILD_SH = Path(__file__).resolve().parent / "build.sh"
KUBE_ROUTER_VERSION = os.environ.get("KUBE_ROUTER_VERSION", "v2.1.0")
COMPONENT = "kube-router"
#: the identity of its client certificate, and its ClusterRole(Binding)
USER = "system:mpilaunch-netpol"
ROLE = "mpilaunch-testbed-netpol"
#: what kube-router's informers list and watch (all of them must sync before it starts)
RBAC_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
]
#: the iptables chains (filter table) and ipsets kube-router's policy controller makes
CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "inet6:KUBE-SRC-", "inet6:KUBE-DST-")
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


class NetpolError(RuntimeError):
    pass


def dns_peer(node_ip: str) -> dict:
    """The egress peer that reaches the testbed's DNS (CoreDNS on the node IP); with DNS_PORTS."""
    return {"ipBlock": {"cidr": f"{node_ip}/32"}}


def api_server_rules(apiserver_port: int, service_ip: str | None = None) -> list[dict]:
    """Egress rules that let a pod reach the API server on this testbed: the
    DNAT's target (127.0.0.1:<port>, what kube-router sees) and the Service
    address (for enforcers that match before the DNAT)."""
    from .network import SERVICE_IP

    return [
        {"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}], "ports": [{"protocol": "TCP", "port": apiserver_port}]},
        {"to": [{"ipBlock": {"cidr": f"{service_ip or SERVICE_IP}/32"}}], "ports": [{"protocol": "TCP", "port": 443}]},
    ]


def binary() -> Path:
    from .common import cache_dir

    return cache_dir() / "bin" / f"kube-router-{KUBE_ROUTER_VERSION}"


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) kube-router; its path (with Kubernetes' packages compiled: ~1.5 min)."""
    b = binary()
    if not os.access(b, os.X_OK):
        env = {**os.environ, "KUBE_ROUTER_VERSION": KUBE_ROUTER_VERSION}
        subprocess.run(
            ["bash", str(BUILD_SH), COMPONENT], check=True, env=env, stdout=subprocess.DEVNULL if quiet else None
        )
    return b


def missing_prerequisites() -> list[str]:
    out = [t for t in ("iptables", "iptables-save", "iptables-restore", "ipset") if shutil.which(t) is None]
    if not os.access(binary(), os.X_OK):
        out.append(f"{binary()} (run testbeds/k8s/build.sh kube-router)")
    return out


def _sh(*cmd, check: bool = False) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and p.returncode:
        raise NetpolError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip()}")
    return p


# ------------------------------------------------------------------ iptables/ipset state (pure parts)


def ours(name: str) -> bool:
    return name.startswith(CHAIN_PREFIXES)


def cleanup_commands(filter_save: str, ipsets: list[str]) -> list[list[str]]:
    """The commands that remove kube-router's policy state, given ``iptables-save -t filter``
    and ``ipset list -n``: the jumps from other chains to its chains, then its chains
    (flushed, deleted), then its ipsets (which only its rules referenced)."""
    chains = [line[1:].split()[0] for line in filter_save.splitlines() if line.startswith(":")]
    cmds: list[list[str]] = []
    for line in filter_save.splitlines():
        if not line.startswith("-A "):
            continue
        parts = line.split()
        chain = parts[1]
        target = parts[parts.index("-j") + 1] if "-j" in parts else ""
        if not ours(chain) and ours(target):
            # the rule as iptables-save prints it, quoted comments included
            cmds.append(["iptables-delete", line])
    mine = [c for c in chains if ours(c)]
    cmds += [["iptables", "-t", "filter", "-F", c] for c in mine]
    cmds += [["iptables", "-t", "filter", "-X", c] for c in mine]
    cmds += [["ipset", "destroy", s] for s in ipsets if s.startswith(IPSET_PREFIXES)]
    return cmds


def _delete_rule(save_line: str) -> None:
    # iptables-save quotes comments with spaces; let a shell split it the same way
    import shlex

    args = shlex.split(save_line)
    args[0] = "-D"
    _sh("iptables", "-t", "filter", *args)


def remove_state() -> list[str]:
    """Remove every kube-router policy rule, chain and ipset from this machine; what is
    left of them afterwards (empty: clean)."""
    for _ in range(3):  # a rule referencing a chain being deleted, a set in use: retry once or twice
        save = _sh("iptables-save", "-t", "filter").stdout
        sets = _sh("ipset", "list", "-n").stdout.split()
        cmds = cleanup_commands(save, sets)
        if not cmds:
            return []
        for cmd in cmds:
            if cmd[0] == "iptables-delete":
                _delete_rule(cmd[1])
            else:
                _sh(*cmd)
    return leftovers()


def leftovers() -> list[str]:
    save = _sh("iptables-save", "-t", "filter").stdout
    left = [line for line in save.splitlines() if re.search(r"KUBE-(ROUTER|POD-FW|NWPLCY)-", line)]
    left += [s for s in _sh("ipset", "list", "-n").stdout.split() if s.startswith(IPSET_PREFIXES)]
    return left


# ------------------------------------------------------------------ the enforcer


class NetworkPolicyEnforcer:
    """kube-router's policy controller for the real node of a running KubeCluster."""

    def __init__(self, cluster, node_name: str, service_cidr: str, state_dir: Path, verbosity: int = 1):
        self.c = cluster
        self.node_name = node_name
        self.service_cidr = service_cidr
        self.dir = state_dir
        self.verbosity = verbosity
        # where the bridge-nf-call-iptables value found before start is kept, so a `down`
        # from another process (KubeCluster.attach) puts it back too
        self.saved_sysctl = state_dir / "bridge-nf-call-iptables.before"
        self.start_seconds: float | None = None

    def start(self, timeout: float = 60.0) -> "NetworkPolicyEnforcer":
        from ..ports import free_port

        missing = missing_prerequisites()
        if missing:
            raise NetpolError("the NetworkPolicy enforcer needs: " + ", ".join(missing))
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_state()  # what a run killed before its stop left
        self._bridge_netfilter()
        self.c.apply(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": ROLE},
                    "rules": RBAC_RULES,
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": ROLE},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
                },
            ]
        )
        kc = self.c.client_kubeconfig(self.dir / "kube-router.kubeconfig", USER)
        health = free_port()
        self.c.ports["kube-router-health"] = health
        self.c.spawn(
            COMPONENT,
            [
                binary(),
                f"--kubeconfig={kc}",
                f"--hostname-override={self.node_name}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--run-loadbalancer=false",
                "--enable-ipv6=false",
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--health-port={health}",
                "--metrics-port=0",
                # events drive the syncs; this is only the periodic safety net
                "--iptables-sync-period=1m",
                "--cache-sync-timeout=30s",
                f"--v={self.verbosity}",
            ],
        )
        try:
            # healthy = its informers synced and the policy controller beat; the default chain
            # is there once the first full sync ran
            self.c.wait(
                lambda: (
                    self.c.http_ok(f"http://127.0.0.1:{health}/healthz")
                    and "KUBE-NWPLCY-DEFAULT" in _sh("iptables", "-t", "filter", "-S").stdout
                ),
                timeout,
                "kube-router's policy controller synced",
            )
        except BaseException as e:
            tail = self.c.log_tail(COMPONENT)
            self.stop()
            raise NetpolError(f"{e}\nkube-router log:\n{tail}") from None
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill kube-router, remove its rules, chains and ipsets, put the bridge sysctl back.
        Safe to call twice, and from another process than the one that started it."""
        self.c.kill_component(COMPONENT)
        left = remove_state()
        if self.saved_sysctl.exists():
            try:
                BRIDGE_NF.write_text(self.saved_sysctl.read_text().strip() + "\n")
            except OSError:
                pass
            self.saved_sysctl.unlink()
        if left:
            raise NetpolError("kube-router's state is still on this machine: " + "; ".join(left[:10]))

    def _bridge_netfilter(self) -> None:
        if not BRIDGE_NF.exists():
            _sh("modprobe", "br_netfilter")
        if not BRIDGE_NF.exists():
            raise NetpolError(
                "br_netfilter is not available (no /proc/sys/net/bridge): bridged pod traffic would bypass iptables"
            )
        before = BRIDGE_NF.read_text().strip()
        if before != "1":
            if not self.saved_sysctl.exists():
                self.saved_sysctl.write_text(before + "\n")
            BRIDGE_NF.write_text("1\n")
