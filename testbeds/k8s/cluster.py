"""A real Kubernetes control plane on this machine, for tests.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler run as
local processes; kwok fakes the nodes (and their kubelet API) so pods get
scheduled and become Running without a container runtime, and
``kubectl exec`` into a pod on a kwok node runs the command as a local
process (kwok's ClusterExec "local" target).

Stdlib only. Binaries come from ``build.sh`` (cached in
``$MPILAUNCH_CACHE/mpilaunch-k8s/bin``); certificates are made with the ``openssl``
CLI.

Python use::

    from testbeds.k8s.cluster import KubeCluster
    with KubeCluster() as c:
        c.create_nodes(4, gpus=8)
        c.kubectl("get", "nodes")

Command line::

    python -m testbeds.k8s.cluster up [--nodes 16 --gpus 8] [--workdir DIR]
    python -m testbeds.k8s.cluster status [--workdir DIR]
    python -m testbeds.k8s.cluster down [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ..procs import pid_alive
from .binaries import ETCD_VERSION, K8S_VERSION, KWOK_VERSION, MARKER_ENV, binary_names, ensure_built, kill_all
from .client import ClusterClient
from .common import ClusterError, cache_dir
from .control_plane import ControlPlane
from .pki import PKI

STATE_FILE = "cluster.json"
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "mpilaunch-k8s"


class KubeCluster(ControlPlane, ClusterClient):
    """A local control plane with kwok nodes.

    Attributes (valid after ``start()``): ``workdir`` (Path), ``kubeconfig``
    (Path of an admin kubeconfig, certificates embedded), ``server``
    (``https://127.0.0.1:PORT``), ``bindir``, ``kubectl_bin``, ``exec_dir``
    (the working directory of commands kwok execs), ``pids`` (component ->
    pid).
    """

    COMPONENTS = (
        "token-webhook",
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "pod-runner",
    )

    def __init__(
        self,
        workdir: str | os.PathLike | None = None,
        *,
        exec_dir: str | os.PathLike | None = None,
        exec_env: dict[str, str] | None = None,
        complete_job_pods: bool = False,
        enable_exec_crd: bool = True,
        verbosity: int = 1,
        keep_workdir: bool | None = None,
        start_timeout: float = 180.0,
        real_node: bool = False,
        volcano: bool = False,
        kueue: bool = False,
    ):
        """
        workdir: where certs, configs, etcd data and logs go (default: a new
            temp dir, removed by stop() unless keep_workdir).
        exec_dir: cwd of commands run by ``kubectl exec`` (default
            WORKDIR/exec).
        exec_env: extra environment for those commands (they otherwise
            inherit kwok's environment, i.e. this process's).
        complete_job_pods: include kwok's "pod-complete" stage, which marks
            pods owned by a Job Succeeded right after they run (off: such pods
            stay Running, like sleeping workers).
        enable_exec_crd: serve kwok's namespaced ``Exec`` CRD so tests can
            give a single pod its own workDir/env (``set_pod_exec``).
        real_node: also run a real node (containerd + kubelet + CoreDNS,
            see ``node.py``); ``add_real_node()`` does it later.
        volcano, kueue: also run Volcano's scheduler (``volcano.py``) and
            Kueue with its webhooks (``kueue.py``); ``add_volcano()`` and
            ``add_kueue()`` do it later.
        """
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="mpilaunch-k8s-"))
        self.keep_workdir = (not self._own_workdir) if keep_workdir is None else keep_workdir
        self.exec_dir = Path(exec_dir) if exec_dir else self.workdir / "exec"
        self.exec_env = dict(exec_env or {})
        self.complete_job_pods = complete_job_pods
        self.enable_exec_crd = enable_exec_crd
        self.verbosity = verbosity
        self.start_timeout = start_timeout
        self.marker = uuid.uuid4().hex
        self.bindir: Path | None = None
        self.kubectl_bin: str | None = None
        self.kubeconfig: Path = self.workdir / "admin.kubeconfig"
        self.server: str | None = None
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._started = False
        self.want_real_node = real_node
        self.node = None  # a node.RealNode once add_real_node() ran
        self.want_addons = {"volcano": volcano, "kueue": kueue}
        self.volcano = self.kueue = None  # their objects once add_volcano() / add_kueue() ran
        self.cache = cache_dir()

    # ---------------------------------------------------------- lifecycle

    def __enter__(self) -> "KubeCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "KubeCluster":
        if self._started:
            return self
        t0 = time.monotonic()
        self.bindir = ensure_built()
        names = binary_names()
        self._bin = {c: self.bindir / n for c, n in names.items()}
        self.kubectl_bin = str(self._bin["kubectl"])
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("etcd-data", "pki"):  # a reused workdir starts afresh
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.exec_dir.mkdir(parents=True, exist_ok=True)
        self._started = True
        try:
            self._make_pki()
            self._start_token_webhook()
            self._start_etcd()
            self._start_apiserver()
            self.wait_apiserver_ready(timeout=self.start_timeout)
            self._bind_token_users()
            if self.enable_exec_crd:
                self._apply_kwok_crds()
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._start_pod_runner()
            self._wait_control_plane(timeout=self.start_timeout - (time.monotonic() - t0))
            if self.want_real_node:
                self.add_real_node()
            if self.want_addons["volcano"]:
                self.add_volcano()
            if self.want_addons["kueue"]:
                self.add_kueue()
            self._write_state()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill every process started (by process group, then by the
        environment marker, which also catches what kwok exec'd and anything
        that daemonized), wait for them, remove a temporary workdir."""
        if self.kueue is not None:  # its webhooks go first: without it they would refuse every pod
            self.kueue.stop()
            self.kueue = None
        if self.volcano is not None:
            self.volcano.stop()
            self.volcano = None
        if self.node is not None:
            # its pods go through the kubelet and the API server, so first
            self.node.stop()
            self.node = None
        order = list(reversed(self.COMPONENTS))
        pgids = [self.pids[c] for c in order if c in self.pids]
        # kwok first, so its exec'd commands go before the apiserver does
        for c in order:
            if c in self.pids:
                kill_all([self.pids[c]], None, timeout=10.0)
        kill_all(pgids, self.marker, timeout=5.0)
        for p in self._procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self.pids.clear()
        self._started = False
        state = self.workdir / STATE_FILE
        if state.exists():
            state.unlink()
        if not self.keep_workdir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---------------------------------------------------------- processes

    def _spawn(self, name: str, args: list, pass_fds: tuple = (), env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")
        env = {**os.environ, **(env or {})}
        env[MARKER_ENV] = self.marker
        env.pop("KUBECONFIG", None)
        p = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        log.close()
        self._procs[name] = p
        self.pids[name] = p.pid
        return p

    def check_alive(self) -> None:
        """Raise ClusterError naming the first of its processes that exited, with its log's tail."""
        for name, p in self._procs.items():
            if p.poll() is not None:
                tail = self.log_tail(name)
                raise ClusterError(f"{name} exited with {p.returncode}; log tail:\n{tail}")

    def log_tail(self, name: str, n: int = 30) -> str:
        f = self.workdir / "logs" / f"{name}.log"
        if not f.exists():
            return ""
        return "\n".join(f.read_text(errors="replace").splitlines()[-n:])

    def _write_state(self) -> None:
        state = {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "pids": self.pids,
            "ports": self.ports,
            "marker": self.marker,
            "kubectl": self.kubectl_bin,
            "exec_dir": str(self.exec_dir),
            "versions": {"kubernetes": K8S_VERSION, "etcd": ETCD_VERSION, "kwok": KWOK_VERSION},
            "real_node": self.node is not None,
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def attach(cls, workdir: str | os.PathLike) -> "KubeCluster":
        """A cluster started elsewhere (``up``), from its state file: its
        helpers work, ``stop()`` ends it (the real node included)."""
        workdir = Path(workdir)
        st = _load_state(workdir)
        if not st:
            raise ClusterError(f"no cluster state in {workdir}")
        c = cls(workdir, keep_workdir=True)
        c.kubeconfig, c.server, c.kubectl_bin = Path(st["kubeconfig"]), st["server"], st["kubectl"]
        c.marker, c.exec_dir, c.pids, c.ports = st["marker"], Path(st["exec_dir"]), st["pids"], st["ports"]
        c.bindir = Path(st["kubectl"]).parent
        c.pki = PKI.__new__(PKI)
        c.pki.d = workdir / "pki"
        c.pki.ca_crt, c.pki.ca_key = c.pki.d / "ca.crt", c.pki.d / "ca.key"
        c._started = True
        if st.get("real_node"):
            from .node import RealNode

            c.node = RealNode(c)
        return c

    # ---------------------------------------------------------- the real node

    def add_real_node(self):
        """Start the real node (containerd + kubelet + CoreDNS, ``node.py``)
        next to the kwok nodes; returns it. Idempotent."""
        if self.node is None:
            from .node import RealNode

            self.node = RealNode(self).start()
        return self.node

    def add_network_policy(self):
        """Start the real node's NetworkPolicy enforcer (kube-router's policy controller,
        ``netpol.py``) unless it runs; returns it. Idempotent. The real node starts it
        itself; this is for a testbed started without it (``MPILAUNCH_K8S_NETPOL=0``, or
        ``up`` from an older checkout), attached to with ``attach``."""
        if self.node is None:
            raise ClusterError("no real node: the NetworkPolicy enforcer runs beside it (add_real_node first)")
        enforcer = self.node.start_netpol()
        self._write_state()
        return enforcer

    def add_volcano(self):
        """Start Volcano's scheduler and controllers (``volcano.py``); returns it. Idempotent."""
        if self.volcano is None:
            from .volcano import Volcano

            self.volcano = Volcano(self).start()
        return self.volcano

    def add_kueue(self):
        """Start Kueue and its webhooks (``kueue.py``); returns it. Idempotent."""
        if self.kueue is None:
            from .kueue import Kueue

            self.kueue = Kueue(self).start()
        return self.kueue

    # helpers node.py builds on (wait and http_ok: client.py)
    spawn = _spawn

    def kill_component(self, name: str) -> None:
        if name in self.pids:
            kill_all([self.pids.pop(name)], None, timeout=10.0)
            p = self._procs.pop(name, None)
            if p is not None:
                p.wait(timeout=5)

    def client_kubeconfig(self, path: Path, cn: str, orgs=()) -> Path:
        name = cn.replace(":", "-")
        return self._kubeconfig(path, cn, self.pki.cert(name, cn, orgs=list(orgs)))

    def detach(self) -> None:
        """Forget the processes without stopping them (the CLI's `up`)."""
        self._procs.clear()
        self._started = False


# --------------------------------------------------------------------------
# CLI


def _load_state(workdir: Path) -> dict | None:
    f = workdir / STATE_FILE
    if not f.exists():
        return None
    return json.loads(f.read_text())


def _cmd_up(args) -> int:
    workdir = Path(args.workdir)
    st = _load_state(workdir)
    if st and any(pid_alive(p) for p in st["pids"].values()):
        print(f"a cluster is already running in {workdir} (server {st['server']}); `down` it first", file=sys.stderr)
        return 1
    c = KubeCluster(workdir, keep_workdir=True, real_node=args.real_node, volcano=args.volcano, kueue=args.kueue)
    c.start()
    if args.nodes:
        c.create_nodes(args.nodes, gpus=args.gpus, prefix=args.prefix, taint=args.taint)
    c.detach()
    print(f"# cluster up in {c.start_seconds:.1f}s: {c.server}, workdir {workdir}", file=sys.stderr)
    print(f"export KUBECONFIG={c.kubeconfig}")
    return 0


def _cmd_down(args) -> int:
    workdir = Path(args.workdir)
    st = _load_state(workdir)
    if not st:
        print(f"no cluster state in {workdir}", file=sys.stderr)
        return 0
    if st.get("real_node"):
        # its pods go through the kubelet and the API server, so first
        KubeCluster.attach(workdir).node.stop()
    order = ["kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
    pgids = [st["pids"][c] for c in order if c in st["pids"]]
    for pg in pgids:
        kill_all([pg], None, timeout=10.0)
    kill_all(pgids, st.get("marker"), timeout=5.0)
    (workdir / STATE_FILE).unlink()
    if args.purge:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"cluster in {workdir} stopped", file=sys.stderr)
    return 0


def _cmd_status(args) -> int:
    workdir = Path(args.workdir)
    st = _load_state(workdir)
    if not st:
        print(f"no cluster in {workdir}")
        return 1
    alive = {c: pid_alive(p) for c, p in st["pids"].items()}
    print(f"server:     {st['server']}")
    print(f"kubeconfig: {st['kubeconfig']}")
    for c, p in st["pids"].items():
        print(f"  {c:24s} pid {p:<8d} {'running' if alive[c] else 'DEAD'}")
    ok = all(alive.values())
    if ok and st.get("kubectl"):
        r = subprocess.run(
            [st["kubectl"], f"--kubeconfig={st['kubeconfig']}", "get", "--raw=/readyz"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        print(f"readyz:     {r.stdout.strip() or r.stderr.strip()}")
        ok = r.returncode == 0
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testbeds.k8s.cluster", description="local Kubernetes control plane with kwok nodes"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down", "status", "build"):
        p = sub.add_parser(name)
        p.add_argument("--workdir", default=str(DEFAULT_WORKDIR))
        if name == "up":
            p.add_argument("--nodes", type=int, default=16)
            p.add_argument("--gpus", type=int, default=8)
            p.add_argument("--prefix", default="node")
            p.add_argument("--taint", action="store_true", help="taint nodes kwok.x-k8s.io/node=fake:NoSchedule")
            p.add_argument(
                "--real-node",
                action="store_true",
                help="also run a real node (containerd + kubelet + CoreDNS; root; see node.py)",
            )
            p.add_argument("--volcano", action="store_true", help="also run Volcano's scheduler (volcano.py)")
            p.add_argument("--kueue", action="store_true", help="also run Kueue and its webhooks (kueue.py)")
        if name == "down":
            p.add_argument("--purge", action="store_true", help="also remove the workdir")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(ensure_built())
        return 0
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
