"""A real node for the Kubernetes testbed: containerd + runc + CNI bridge +
kubelet, CoreDNS, and a route from pods to the API server.

Pods on this node are real containers with their own network namespace and
IP on a bridge the testbed creates (``mplpods0``, 10.233.0.0/24 by default)
and removes; nothing is routed or NATed beyond that bridge. What a pod sees:

* ``KUBERNETES_SERVICE_HOST=10.96.0.1:443`` (the ``kubernetes`` Service):
  an iptables DNAT rule owned by the testbed sends that address, arriving on
  the bridge, to the API server on 127.0.0.1 (``route_localnet`` on the
  bridge only, so the API server keeps listening on loopback alone);
* DNS: CoreDNS (a host process, like etcd) on the bridge gateway serves
  ``cluster.local``, so ``<pod>.<subdomain>.<namespace>.svc`` and
  ``kubernetes.default`` resolve; nothing is forwarded outside.
* NetworkPolicy: a real enforcer (kube-router's policy controller,
  ``netpol.py``) starts with the kubelet, so policies in a namespace are
  enforced on the pods of this node (``MPILAUNCH_K8S_NETPOL=0``: none runs).

The node registers as ``mpilaunch-real-0`` with the label and taint
``mpilaunch.testbed/real-pods=true`` (NoSchedule), so kwok tests never land
on it and real-pod jobs ask for it with ``--node-selector`` and
``--toleration``. kwok leaves it alone (it manages annotated nodes only).

What this machine needs, found when the testbed was built: containerd's CRI needs
``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here); kubelet runs with the
cgroupfs driver, no QoS cgroups, no node-allocatable enforcement, swap
allowed, and ``--node-ip`` on the bridge gateway (a loopback node IP is
refused).

containerd's root (image store) is cached in
``$MPILAUNCH_K8S_CACHE/containerd`` so imported images survive restarts;
only one real node can run on a machine at a time (a lock file says so).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import links
from ..procs import pid_alive
from .node_config import (
    CNI_BIN,
    PAUSE_IMAGE,
    POD_SUBNET,
    REAL_KEY,
    cni_config,
    containerd_config,
    corefile,
    dnat_rule,
    gateway,
    kubelet_config,
    testbed_rules_on,
)

REPO = Path(__file__).resolve().parents[2]
NODE_NAME = "mpilaunch-real-0"
BRIDGE = os.environ.get("MPILAUNCH_K8S_BRIDGE", "mplpods0")
APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "ipset")
#: what a real-pod job passes so its pods land here (mpilaunch options)
# The launcher and reaper are placed on their own (mpilaunch pins them nowhere by default): here
# they must run too, so they ask for the real node as well.
JOB_ARGS = (
    "--node-selector",
    f"{REAL_KEY}=true",
    "--toleration",
    f"{REAL_KEY}=true:NoSchedule",
    "--launcher-node-selector",
    f"{REAL_KEY}=true",
    "--launcher-toleration",
    f"{REAL_KEY}=true:NoSchedule",
)


class NodeError(RuntimeError):
    pass


def _sh(*cmd, check=True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and p.returncode != 0:
        raise NodeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def missing_prerequisites() -> list[str]:
    """What the real node needs from the machine and does not find (empty: ready)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (containerd, bridges and iptables need it)")
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip"):
        if shutil.which(tool) is None:
            out.append(tool)
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(f"{CNI_BIN}/{plugin}", os.X_OK):
            out.append(f"{CNI_BIN}/{plugin} (containernetworking-plugins)")
    if os.environ.get("MPILAUNCH_K8S_NETPOL", "1") != "0":
        from .netpol import missing_prerequisites as netpol_missing

        out += netpol_missing()
    return out


SMOKE_PROGRAM = r"""
import socket, ssl
me = socket.gethostname()
api = socket.gethostbyname("kubernetes.default.svc.cluster.local")
ip = socket.gethostbyname(me)
with socket.create_connection((api, 443), timeout=10) as raw:
    ctx = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    with ctx.wrap_socket(raw, server_hostname="kubernetes.default.svc") as tls:
        tls.sendall(b"GET /livez HTTP/1.0\r\nHost: kubernetes.default.svc\r\n\r\n")
        answer = tls.recv(100)
print("smoke ok", me, ip, api, answer.split(b"\r\n")[0].decode())
"""


# ------------------------------------------------------------------ the node


def shared_netns_dir(path: str = "/run/netns") -> None:
    """Make ``path`` a shared mount of its own before containerd mounts pods' network namespaces
    in it, as ``ip netns add`` does the first time it runs. Where ``ip netns`` (the ssh testbed's
    hosts) did that later, on a freshly booted machine, its bind mount covered the pods' namespace
    files: the kubelet could neither unmount nor remove them ("failed to remove netns: unlinkat
    /run/netns/cni-...: device or resource busy") and those pods were never deleted."""
    os.makedirs(path, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", path]).returncode != 0:
        subprocess.run(["mount", "--bind", path, path], check=True)
    subprocess.run(["mount", "--make-shared", path], check=True)


class RealNode:
    """The real node of a running :class:`~testbeds.k8s.cluster.KubeCluster`."""

    def __init__(self, cluster, subnet: str = POD_SUBNET, bridge: str = BRIDGE):
        self.c = cluster
        self.subnet = subnet
        self.bridge = bridge
        self.node_ip = gateway(subnet)
        self.dir = cluster.workdir / "node"
        self.cache = cluster.cache
        self.sock = self.dir / "containerd.sock"
        self.comment = f"mpilaunch-testbed-{cluster.marker[:12]}"
        self._lock = None
        self.netpol = None  # a netpol.NetworkPolicyEnforcer once start_netpol() ran

    # ---------------------------------------------------------- public

    def start(self) -> "RealNode":
        missing = missing_prerequisites()
        if missing:
            raise NodeError("real node needs: " + ", ".join(missing) + " (run testbeds/k8s/build-node.sh)")
        coredns = self.c.bindir / "coredns"
        if not os.access(coredns, os.X_OK):
            raise NodeError(f"{coredns} missing (run testbeds/k8s/build.sh coredns)")
        self._take_lock()
        t0 = time.monotonic()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._make_bridge()
            shared_netns_dir()
            self._start_containerd()
            self.ensure_image(self.cache / "images" / "pause.tar", PAUSE_IMAGE)
            self._route_to_apiserver()
            self._start_coredns(coredns)
            self._start_kubelet()
            self.c.wait_nodes_ready([NODE_NAME], timeout=120, selector=None)
            if os.environ.get("MPILAUNCH_K8S_NETPOL", "1") != "0":
                self.start_netpol()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Pods first (through the kubelet, so CNI releases their addresses),
        then kubelet, the NetworkPolicy enforcer (its iptables rules and
        ipsets too), leftover containers, containerd, CoreDNS, the DNAT rule,
        mounts and the bridge. Safe to call twice."""
        if "kubelet" in self.c.pids:
            self._drain()
        for name in ("kubelet", "coredns"):
            self.c.kill_component(name)
        self.stop_netpol()
        if "containerd" in self.c.pids:
            self._kill_leftover_tasks()
            self.c.kill_component("containerd")
        self._unmount_under(self.dir)
        self._remove_route()
        self._remove_bridge()
        self.c.kill_component("node-lock")
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def start_netpol(self):
        """Start the NetworkPolicy enforcer (``netpol.py``) for this node; returns it.
        Idempotent: one already running (also one started by another process of this
        testbed, for a cluster from ``KubeCluster.attach``) is kept."""
        from .netpol import COMPONENT, NetworkPolicyEnforcer
        from .network import SERVICE_CIDR

        if self.netpol is None:
            enforcer = NetworkPolicyEnforcer(
                self.c, NODE_NAME, SERVICE_CIDR, self.dir / "netpol", verbosity=self.c.verbosity
            )
            pid = self.c.pids.get(COMPONENT)
            self.netpol = enforcer if pid and pid_alive(pid) else enforcer.start()
        return self.netpol

    def stop_netpol(self) -> None:
        """Stop the enforcer and remove its iptables/ipset state (whoever started it).
        What cannot be removed is said on stderr: the rest of the node's stop still runs."""
        from .netpol import NetpolError, NetworkPolicyEnforcer
        from .network import SERVICE_CIDR

        enforcer = self.netpol or NetworkPolicyEnforcer(self.c, NODE_NAME, SERVICE_CIDR, self.dir / "netpol")
        self.netpol = None
        try:
            enforcer.stop()
        except NetpolError as e:
            print(f"[real node] {e}", file=sys.stderr)

    def ctr(self, *args, check=True, timeout=600) -> subprocess.CompletedProcess:
        return _sh("ctr", "--address", self.sock, "-n", "k8s.io", *args, check=check, timeout=timeout)

    def has_image(self, ref: str) -> bool:
        out = self.ctr("images", "ls", "-q").stdout.split()
        return ref in out

    def ensure_image(self, archive: Path, ref: str) -> float:
        """Import a docker/OCI archive into containerd unless `ref` is there; seconds spent."""
        if self.has_image(ref):
            return 0.0
        if not archive.exists():
            raise NodeError(f"image archive {archive} missing (run testbeds/k8s/build-node.sh)")
        t0 = time.monotonic()
        self.ctr("images", "import", archive)
        if not self.has_image(ref):
            raise NodeError(
                f"importing {archive} did not give {ref}: " + " ".join(self.ctr("images", "ls", "-q").stdout.split())
            )
        return time.monotonic() - t0

    def project_image(self, with_tf: bool = False, with_horovod: bool = False) -> str:
        """The project's image (docker/Dockerfile) for the current sources,
        in containerd: built with scripts/build-image.sh (only the code layer
        when just the code changed) and imported when missing. Its tag.
        ``with_horovod``: the variant with TensorFlow, PyTorch and Horovod
        (``--with-horovod``, which needs scripts/build-horovod.sh's wheel: built
        there when missing), a tag of its own. ``with_tf`` (PS mode) asks for
        that same variant, a superset of ``--with-tf``: one image for PS mode and
        Horovod, not two."""
        script = REPO / "scripts" / "build-image.sh"
        env = {**os.environ, "MPILAUNCH_BUILDAH_ROOT": str(self.cache / "buildah")}
        variant = with_tf or with_horovod
        flags = ["--local-base", *(["--with-horovod"] if variant else [])]
        # --with-horovod: the tag of the wheel built last; none before the first build
        printed = _sh("bash", script, *flags, "--print-tag", env=env, check=False)
        tag = printed.stdout.strip() if printed.returncode == 0 else ""
        if tag and self.has_image(tag):
            return tag
        name = "mpilaunch-horovod" if variant else "mpilaunch"
        archive, tagfile = self.cache / "images" / f"{name}.tar", self.cache / "images" / f"{name}.tag"
        if not (tag and archive.exists() and tagfile.exists() and tagfile.read_text().strip() == tag):
            # the tag built is the script's last line (--with-horovod: of the wheel it built or checked)
            built = _sh("bash", script, *flags, "--archive", archive, env=env, timeout=3600)
            tag = built.stdout.strip().splitlines()[-1]
            tagfile.write_text(tag + "\n")
        self.ensure_image(archive, tag)
        return tag

    def foreign_image(self, name: str) -> str:
        """An image without mpilaunch (``build-foreign-images.sh``: ``openmpi``, ``mpich``,
        ``nopython``), built when missing and imported into containerd; its tag."""
        env = {**os.environ, "MPILAUNCH_BUILDAH_ROOT": str(self.cache / "buildah")}
        _sh("bash", REPO / "testbeds" / "k8s" / "build-foreign-images.sh", name, env=env, timeout=1800)
        tag = (self.cache / "images" / f"foreign-{name}.tag").read_text().strip()
        self.ensure_image(self.cache / "images" / f"foreign-{name}.tar", tag)
        return tag

    def containers_of(self, pod_prefix: str) -> list[str]:
        """Running containers (sandboxes included) of pods whose name starts
        with `pod_prefix`. Exited ones wait for the kubelet's container GC
        (once a minute) and hold no process, so they do not count."""
        flt = f'labels."io.kubernetes.pod.name"~="^{pod_prefix}"'
        ids = set(self.ctr("containers", "ls", "-q", flt, check=False).stdout.split())
        tasks = [line.split() for line in self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]]
        return [t[0] for t in tasks if len(t) >= 3 and t[0] in ids and t[2] == "RUNNING"]

    def smoke_check(self, image: str, timeout: float = 120.0) -> float:
        """One pod of `image` on this node proves the pieces a job needs: it
        runs, has its own IP, resolves its own DNS name and
        kubernetes.default.svc through CoreDNS, and reaches the API server
        there over TLS. Seconds taken; NodeError with the pod's log if not."""
        t0 = time.monotonic()
        name = "mpilaunch-smoke"
        self.c.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true", check=False)
        self.c.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "restartPolicy": "Never",
                    "hostname": name,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {REAL_KEY: "true"},
                    "tolerations": [{"key": REAL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "smoke",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["python3", "-c", SMOKE_PROGRAM],
                        }
                    ],
                },
            }
        )
        try:
            deadline = time.monotonic() + timeout
            phase = None
            while time.monotonic() < deadline:
                pod = self.c.get_json("pod", name)
                phase = pod.get("status", {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    break
                time.sleep(0.5)
            log = self.c.kubectl("logs", name, check=False).stdout.strip()
            if phase != "Succeeded":
                raise NodeError(f"smoke pod on the real node ended {phase}: {log[-2000:]}")
        finally:
            self.c.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=false", check=False)
        return time.monotonic() - t0

    # ---------------------------------------------------------- pieces

    def _take_lock(self) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        f = open(self.cache / "real-node.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise NodeError(
                "another testbed already runs the real node on this machine "
                f"(lock {self.cache / 'real-node.lock'}); stop it first"
            ) from None
        self._lock = f
        # A process of the node's own holds the lock as long as the node runs: the
        # hold of `cluster up`, which exits, would end with it, and a second node
        # started then tears this one's bridge and DNAT rule down (seen: pods of
        # the running node could no longer reach the API server).
        self.c.spawn("node-lock", [sys.executable, "-c", "import signal; signal.pause()"], pass_fds=(f.fileno(),))

    def _make_bridge(self) -> None:
        # a bridge an earlier node of this test run stopped with and left for the run's end (links.py)
        # is reused as it is; any other is a previous run's that died without stop(): reuse is unsafe
        if not links.deferred(self.bridge):
            if links.exists(self.bridge):
                _sh("ip", "link", "del", self.bridge, check=False)
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh(
                "ip", "addr", "add", f"{self.node_ip}/{ipaddress.ip_network(self.subnet).prefixlen}", "dev", self.bridge
            )
        _sh("ip", "link", "set", self.bridge, "up")
        # lets the DNAT below send bridge traffic to 127.0.0.1 (this interface only)
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1\n")

    def _remove_bridge(self) -> None:
        links.remove_link(self.bridge)  # at once, or at the test run's end (links.py: other sessions' MPI jobs)

    def _start_containerd(self) -> None:
        from .network import SERVICE_CIDR

        cni = self.dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-mpilaunch.conflist").write_text(
            json.dumps(cni_config(self.subnet, self.bridge, cni / "ipam", SERVICE_CIDR), indent=2)
        )
        root = self.cache / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "containerd.toml"
        cfg.write_text(containerd_config(root, self.dir / "containerd-state", self.sock, cni / "net.d"))
        self.c.spawn("containerd", ["containerd", "--config", cfg])
        self.c.wait(lambda: self.sock.exists() and self.ctr("version", check=False).returncode == 0, 60, "containerd")

    def _route_to_apiserver(self) -> None:
        from .network import SERVICE_IP

        self._remove_route()
        rule = dnat_rule(self.bridge, SERVICE_IP, self.c.ports["kube-apiserver"], self.comment)
        _sh("iptables", "-t", "nat", "-A", *rule)

    def _remove_route(self) -> None:
        # Every testbed rule on this bridge: this node's, and any left by a run
        # killed before its stop() (seen: the machine restarted mid-test). Such a
        # rule, first in the chain, wins over a new node's: pods were sent to a
        # dead API server port and got "connection refused". The lock says no
        # other node uses this bridge, so no live rule but ours is on it.
        rules = _sh("iptables", "-t", "nat", "-S", "PREROUTING", check=False).stdout.splitlines()
        for line in testbed_rules_on(rules, self.bridge):
            _sh("iptables", "-t", "nat", *line.replace("-A ", "-D ", 1).split(), check=False)

    def _start_coredns(self, binary: Path) -> None:
        from ..ports import free_port

        kc = self.c.client_kubeconfig(self.dir / "coredns.kubeconfig", "coredns", orgs=("system:masters",))
        health, ready = free_port(), free_port()
        self.c.ports["coredns-ready"] = ready
        cf = self.dir / "Corefile"
        cf.write_text(corefile(self.node_ip, kc, health, ready))
        self.c.spawn("coredns", [binary, "-conf", cf])
        self.c.wait(lambda: self.c.http_ok(f"http://127.0.0.1:{ready}/ready"), 60, "CoreDNS ready")

    def _start_kubelet(self) -> None:
        from ..ports import free_port

        d = self.dir / "kubelet"
        for sub in ("root", "pod-logs", "plugins", "certs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        kc = self.c.client_kubeconfig(d / "kubelet.kubeconfig", f"system:node:{NODE_NAME}", orgs=("system:nodes",))
        resolv = d / "resolv.conf"
        resolv.write_text("# pods get the cluster DNS from the kubelet; nothing else\n")
        port, healthz = free_port(), free_port()
        self.c.ports["kubelet"] = port
        cfg = d / "config.json"
        cfg.write_text(
            json.dumps(
                kubelet_config(
                    ca=self.c.pki.ca_crt,
                    sock=self.sock,
                    node_ip=self.node_ip,
                    port=port,
                    healthz_port=healthz,
                    resolv=resolv,
                    pod_logs=d / "pod-logs",
                    plugins=d / "plugins",
                ),
                indent=2,
            )
        )
        self.c.spawn(
            "kubelet",
            [
                self.c.bindir / "kubelet",
                f"--config={cfg}",
                f"--kubeconfig={kc}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'certs'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.node_ip}",
                f"--node-labels={REAL_KEY}=true",
                f"--v={self.c.verbosity}",
            ],
        )

    def _drain(self, timeout: float = 60.0) -> None:
        """Delete every pod bound to this node and wait for the kubelet to
        tear them down (so CNI releases addresses and unmounts volumes)."""
        sel = f"spec.nodeName={NODE_NAME}"
        self.c.kubectl(
            "delete",
            "pods",
            "-A",
            "--field-selector",
            sel,
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
            timeout=60,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.ctr("containers", "ls", "-q", check=False).stdout.split()
            pods = self.c.kubectl(
                "get", "pods", "-A", "--field-selector", sel, "-o", "name", check=False, timeout=30
            ).stdout.split()
            if not left and not pods:
                return
            time.sleep(0.5)

    def _kill_leftover_tasks(self) -> None:
        for cid in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        deadline = time.monotonic() + 10
        for cid in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            while time.monotonic() < deadline and self.ctr("tasks", "delete", cid, check=False).returncode:
                time.sleep(0.2)
        for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", cid, check=False)

    @staticmethod
    def _unmount_under(path: Path) -> None:
        prefix = str(path.resolve())
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            _sh("umount", "-l", m, check=False)
