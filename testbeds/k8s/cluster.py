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
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from ..ports import free_port
from ..procs import pid_alive
from .common import ClusterError, cache_dir
from .network import POD_CIDR, SERVICE_CIDR, SERVICE_IP

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"

K8S_VERSION = os.environ.get("K8S_VERSION", "v1.33.13")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.5.21")
KWOK_VERSION = os.environ.get("KWOK_VERSION", "v0.8.0")

#: annotation / label / taint key kwok uses for the nodes it manages
KWOK_NODE_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
#: every process this module starts (and everything kwok execs) carries this
#: variable in its environment; ``stop()`` sweeps /proc for it
MARKER_ENV = "MPILAUNCH_TESTBED_K8S"
STATE_FILE = "cluster.json"
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "mpilaunch-k8s"


# --------------------------------------------------------------------------
# build


def _kwok_binary_name() -> str:
    import hashlib

    patch = HERE / f"kwok-{KWOK_VERSION}-exec.patch"
    pid = hashlib.sha256(patch.read_bytes()).hexdigest()[:8]
    return f"kwok-{KWOK_VERSION}-p{pid}"


def _binary_names() -> dict[str, str]:
    names = {
        c: f"{c}-{K8S_VERSION}"
        for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
    }
    names["etcd"] = f"etcd-{ETCD_VERSION}"
    names["kwok"] = _kwok_binary_name()
    return names


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) binaries; return the bin directory."""
    bindir = cache_dir() / "bin"
    share = cache_dir() / "share" / f"kwok-{KWOK_VERSION}" / ".complete"
    missing = [n for n in _binary_names().values() if not os.access(bindir / n, os.X_OK)]
    if missing or not share.exists():
        if not quiet:
            print(f"[k8s] building {', '.join(missing) or 'kwok data'} via {BUILD_SH}", file=sys.stderr)
        out = subprocess.DEVNULL if quiet else None
        subprocess.run(["bash", str(BUILD_SH)], check=True, stdout=out)
    return bindir


# --------------------------------------------------------------------------
# helpers


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    try:
        return subprocess.run([str(c) for c in cmd], **kw)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"{' '.join(map(str, cmd))} failed ({e.returncode}): {e.stderr}") from e


def _b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def marked_pids(marker: str) -> list[int]:
    """Pids of processes whose environment carries MARKER_ENV=marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(d))
    return out


def _kill_all(pgids: list[int], marker: str | None, timeout: float = 10.0) -> None:
    """SIGTERM the process groups, then anything carrying the marker; SIGKILL
    what is left after `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pg in pgids:
            try:
                os.killpg(pg, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if marker:
            for pid in marked_pids(marker):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            alive = [pg for pg in pgids if pid_alive(pg)]
            if marker:
                alive += [p for p in marked_pids(marker) if pid_alive(p)]
            if not alive:
                return
            time.sleep(0.1)


# --------------------------------------------------------------------------
# PKI


class _PKI:
    """CA + certificates made with the openssl CLI (EC P-256: fast)."""

    def __init__(self, d: Path):
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        self.ca_crt = d / "ca.crt"
        self.ca_key = d / "ca.key"

    def _key(self, path: Path) -> None:
        # PKCS#8, which every component accepts
        _run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path])
        os.chmod(path, 0o600)

    def make_ca(self) -> None:
        self._key(self.ca_key)
        _run(
            [
                "openssl",
                "req",
                "-x509",
                "-new",
                "-key",
                self.ca_key,
                "-sha256",
                "-days",
                "3650",
                "-subj",
                "/CN=mpilaunch-testbed-ca",
                "-out",
                self.ca_crt,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            ]
        )

    def cert(self, name: str, cn: str, orgs=(), server_sans=None, client=True) -> tuple[Path, Path]:
        key, crt, csr, ext = (
            self.d / f"{name}.key",
            self.d / f"{name}.crt",
            self.d / f"{name}.csr",
            self.d / f"{name}.ext",
        )
        self._key(key)
        subj = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        _run(["openssl", "req", "-new", "-key", key, "-subj", subj, "-out", csr])
        usages = []
        if server_sans is not None:
            usages.append("serverAuth")
        if client:
            usages.append("clientAuth")
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=" + ",".join(usages),
        ]
        if server_sans:
            lines.append("subjectAltName=" + ",".join(server_sans))
        ext.write_text("\n".join(lines) + "\n")
        _run(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                csr,
                "-CA",
                self.ca_crt,
                "-CAkey",
                self.ca_key,
                "-CAcreateserial",
                "-days",
                "3650",
                "-sha256",
                "-extfile",
                ext,
                "-out",
                crt,
            ]
        )
        csr.unlink()
        ext.unlink()
        return crt, key


# --------------------------------------------------------------------------
# the cluster


class KubeCluster:
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
        names = _binary_names()
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
                _kill_all([self.pids[c]], None, timeout=10.0)
        _kill_all(pgids, self.marker, timeout=5.0)
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

    def _make_pki(self) -> None:
        pki = _PKI(self.workdir / "pki")
        self.pki = pki
        pki.make_ca()
        sans = [
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
        self.apiserver_crt, self.apiserver_key = pki.cert("apiserver", "kube-apiserver", server_sans=sans, client=False)
        self.kubelet_client = pki.cert(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=["system:masters"]
        )
        self.admin = pki.cert("admin", "kubernetes-admin", orgs=["system:masters"])
        self.cm = pki.cert("controller-manager", "system:kube-controller-manager")
        self.sched = pki.cert("scheduler", "system:kube-scheduler")
        # kwok updates node and pod status of many nodes: give it admin rights
        self.kwok_client = pki.cert("kwok", "kwok-controller", orgs=["system:masters"])
        self.kwok_serving = pki.cert(
            "kwok-serving", "kwok", server_sans=["IP:127.0.0.1", "DNS:localhost"], client=False
        )
        # service-account token signing key (RSA: RS256 is what clients expect)
        self.sa_key = pki.d / "sa.key"
        self.sa_pub = pki.d / "sa.pub"
        _run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", self.sa_key])
        _run(["openssl", "pkey", "-in", self.sa_key, "-pubout", "-out", self.sa_pub])

    def _kubeconfig(self, path: Path, user: str, cert_key: tuple[Path, Path]) -> Path:
        crt, key = cert_key
        path.write_text(
            textwrap.dedent(f"""\
            apiVersion: v1
            kind: Config
            clusters:
            - name: mpilaunch-testbed
              cluster:
                server: {self.server}
                certificate-authority-data: {_b64(self.pki.ca_crt)}
            users:
            - name: {user}
              user:
                client-certificate-data: {_b64(crt)}
                client-key-data: {_b64(key)}
            contexts:
            - name: {user}@mpilaunch-testbed
              context:
                cluster: mpilaunch-testbed
                user: {user}
                namespace: default
            current-context: {user}@mpilaunch-testbed
            """)
        )
        os.chmod(path, 0o600)
        return path

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        self.ports["etcd-peer"] = peer
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                self._bin["etcd"],
                "--name=node0",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=node0=http://127.0.0.1:{peer}",
                "--initial-cluster-state=new",
                "--auto-compaction-retention=1",
                "--quota-backend-bytes=8589934592",
                "--unsafe-no-fsync=true",  # a throwaway test store: speed over durability
                "--log-level=warn",
            ],
        )
        self._wait(lambda: self._http_ok(f"{self.etcd_url}/health"), 30, "etcd healthy")

    def _start_apiserver(self) -> None:
        port = free_port()
        self.ports["kube-apiserver"] = port
        self.server = f"https://127.0.0.1:{port}"
        self._kubeconfig(self.kubeconfig, "admin", self.admin)
        self._spawn(
            "kube-apiserver",
            [
                self._bin["kube-apiserver"],
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={self.apiserver_crt}",
                f"--tls-private-key-file={self.apiserver_key}",
                f"--client-ca-file={self.pki.ca_crt}",
                f"--kubelet-client-certificate={self.kubelet_client[0]}",
                f"--kubelet-client-key={self.kubelet_client[1]}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                # short-lived exec-plugin tokens (token_auth.py), checked at most 1 s late
                f"--authentication-token-webhook-config-file={self.token_webhook_kubeconfig}",
                "--authentication-token-webhook-version=v1",
                "--authentication-token-webhook-cache-ttl=1s",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # the apiserver is on loopback: do not publish it as the
                # `kubernetes` service's endpoint (loopback endpoints are invalid)
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                f"--v={self.verbosity}",
            ],
        )

    def _start_token_webhook(self) -> None:
        from . import token_auth

        self.token_dir = self.workdir / "token-auth"
        self.token_dir.mkdir(exist_ok=True)
        secret = self.token_dir / "secret"
        secret.write_bytes(os.urandom(32))
        os.chmod(secret, 0o600)
        port = free_port()
        self.ports["token-webhook"] = port
        self.token_webhook_kubeconfig = token_auth.write_webhook_kubeconfig(
            self.workdir / "token-webhook.kubeconfig", port
        )
        self._spawn(
            "token-webhook",
            [sys.executable, "-m", "testbeds.k8s.token_auth", "webhook", "--port", port, "--dir", self.token_dir],
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )

    def _bind_token_users(self) -> None:
        """The token webhook's users may do anything (a test bed; mpilaunch's own RBAC is tested elsewhere)."""
        from .token_auth import GROUP

        self.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "mpilaunch-token-users"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}],
            }
        )

    def token_kubeconfig(self, path: Path, user: str, lifetime: float, state: Path) -> Path:
        """A kubeconfig whose exec plugin hands out tokens valid ``lifetime`` seconds (``token_auth.py``)."""
        from . import token_auth

        state.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "mpilaunch-testbed",
                            "cluster": {"server": self.server, "certificate-authority-data": _b64(self.pki.ca_crt)},
                        }
                    ],
                    "users": [
                        {
                            "name": user,
                            "user": token_auth.exec_user(
                                sys.executable, self.workdir / "token-auth" / "secret", user, lifetime, state
                            ),
                        }
                    ],
                    "contexts": [
                        {
                            "name": f"{user}@mpilaunch-testbed",
                            "context": {"cluster": "mpilaunch-testbed", "user": user, "namespace": "default"},
                        }
                    ],
                    "current-context": f"{user}@mpilaunch-testbed",
                }
            )
        )
        os.chmod(path, 0o600)
        return path

    def _start_controller_manager(self) -> None:
        port = free_port()
        self.ports["kube-controller-manager"] = port
        kc = self._kubeconfig(self.workdir / "controller-manager.kubeconfig", "system:kube-controller-manager", self.cm)
        self._spawn(
            "kube-controller-manager",
            [
                self._bin["kube-controller-manager"],
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--use-service-account-credentials=true",
                f"--root-ca-file={self.pki.ca_crt}",
                f"--service-account-private-key-file={self.sa_key}",
                f"--cluster-signing-cert-file={self.pki.ca_crt}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--profiling=false",
                f"--v={self.verbosity}",
            ],
        )

    def _start_scheduler(self) -> None:
        port = free_port()
        self.ports["kube-scheduler"] = port
        kc = self._kubeconfig(self.workdir / "scheduler.kubeconfig", "system:kube-scheduler", self.sched)
        cfg = self.workdir / "scheduler.yaml"
        cfg.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubescheduler.config.k8s.io/v1
            kind: KubeSchedulerConfiguration
            clientConnection:
              kubeconfig: {kc}
              qps: 500
              burst: 1000
            leaderElection:
              leaderElect: false
            """)
        )
        self._spawn(
            "kube-scheduler",
            [
                self._bin["kube-scheduler"],
                f"--config={cfg}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--v={self.verbosity}",
            ],
        )

    def _kwok_config(self) -> Path:
        share = cache_dir() / "share" / f"kwok-{KWOK_VERSION}"
        stages = ["node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-delete"]
        if self.complete_job_pods:
            stages.append("pod-complete")
        docs = [(share / "stages" / f"{s}.yaml").read_text().strip() for s in stages]
        envs = {MARKER_ENV: self.marker, **self.exec_env}
        env_yaml = "".join(f"\n      - name: {json.dumps(k)}\n        value: {json.dumps(v)}" for k, v in envs.items())
        docs.append(
            textwrap.dedent("""\
            apiVersion: kwok.x-k8s.io/v1alpha1
            kind: ClusterExec
            metadata:
              name: local-exec
            spec:
              execs:
              - local:
                  workDir: {workdir}
                  envs:""").format(workdir=json.dumps(str(self.exec_dir)))
            + env_yaml
        )
        cfg = self.workdir / "kwok.yaml"
        cfg.write_text("\n---\n".join(docs) + "\n")
        return cfg

    def _apply_kwok_crds(self) -> None:
        share = cache_dir() / "share" / f"kwok-{KWOK_VERSION}" / "crds"
        self.kubectl("apply", "-f", share / "kwok.x-k8s.io_execs.yaml")
        self.wait_crds_established(["execs.kwok.x-k8s.io"])

    def _start_kwok(self) -> None:
        port = free_port()
        self.ports["kwok"] = port
        kc = self._kubeconfig(self.workdir / "kwok.kubeconfig", "kwok-controller", self.kwok_client)
        cfg = self._kwok_config()
        args = [
            self._bin["kwok"],
            f"--kubeconfig={kc}",
            f"--config={cfg}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_KEY}={KWOK_NODE_VALUE}",
            "--node-ip=127.0.0.1",
            f"--node-port={port}",
            f"--server-address=127.0.0.1:{port}",
            f"--tls-cert-file={self.kwok_serving[0]}",
            f"--tls-private-key-file={self.kwok_serving[1]}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
        ]
        if self.enable_exec_crd:
            args.append("--enable-crds=Exec")
        self._spawn("kwok", args)

    def _start_pod_runner(self) -> None:
        """The kubelet's part for agent pods on kwok nodes (``pod_runner.py``)."""
        repo = Path(__file__).resolve().parents[2]
        self._spawn(
            "pod-runner",
            [
                sys.executable,
                "-m",
                "testbeds.k8s.pod_runner",
                "--kubeconfig",
                self.kubeconfig,
                "--workdir",
                self.workdir / "pods",
            ],
            env={"PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))},
        )

    def _wait_control_plane(self, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 30)
        for name in ("kube-controller-manager", "kube-scheduler"):
            url = f"https://127.0.0.1:{self.ports[name]}/healthz"
            self._wait(lambda: self._http_ok(url, tls=True), deadline - time.monotonic(), f"{name} healthy")
        self._wait(
            lambda: self._http_ok(f"https://127.0.0.1:{self.ports['kwok']}/healthz", tls=True),
            deadline - time.monotonic(),
            "kwok healthy",
        )
        # pods can only be created once the service-account controller made
        # the namespace's default ServiceAccount
        self._wait(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
            deadline - time.monotonic(),
            "default ServiceAccount",
        )

    # ---------------------------------------------------------- waiting

    def _wait(self, pred, timeout: float, what: str, interval: float = 0.2) -> None:
        deadline = time.monotonic() + max(timeout, 1)
        while True:
            self.check_alive()
            try:
                if pred():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def _http_ok(self, url: str, tls: bool = False, client_cert=None) -> bool:
        ctx = None
        if url.startswith("https"):
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if client_cert:
                ctx.load_cert_chain(*map(str, client_cert))
        try:
            with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_apiserver_ready(self, timeout: float = 120.0) -> None:
        """Wait for GET /readyz to return 200 (admin client cert)."""
        url = f"{self.server}/readyz"
        self._wait(lambda: self._http_ok(url, client_cert=self.admin), timeout, "kube-apiserver /readyz")

    def wait_nodes_ready(self, names=None, timeout: float = 120.0, selector: str | None = "type=kwok") -> None:
        """Wait until the named nodes (default: all kwok nodes) are Ready."""

        def ready():
            nodes = self.get_json("nodes", *(["-l", selector] if selector else []))["items"]
            byname = {n["metadata"]["name"]: n for n in nodes}
            want = list(names) if names is not None else list(byname)
            for w in want:
                n = byname.get(w)
                if n is None:
                    return False
                conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
                if conds.get("Ready") != "True":
                    return False
            return True

        self._wait(ready, timeout, "nodes Ready", interval=0.5)

    def wait_crds_established(self, names, timeout: float = 60.0) -> None:
        """Wait until every named CustomResourceDefinition is Established.

        Not ``kubectl wait --for=condition=Established``: a CRD the API server has not
        yet given a status makes that kubectl fail at once ("status.conditions accessor
        error: <nil>") instead of waiting, which a loaded machine hits (CI did).
        """
        names = list(names)

        def established():
            crds = self.get_json("crd", *names)
            items = crds["items"] if "items" in crds else [crds]
            for crd in items:
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if conds.get("Established") != "True":
                    return False
            return len(items) == len(names)

        self._wait(established, timeout, f"CRDs Established ({', '.join(names)})", interval=0.5)

    def wait_pods(
        self,
        namespace: str = "default",
        selector: str | None = None,
        phase: str = "Running",
        count: int | None = None,
        timeout: float = 120.0,
    ) -> list[dict]:
        """Wait until `count` (default: all matching, at least one) pods are in `phase`."""
        result: list[dict] = []

        def ok():
            args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
            pods = self.get_json(*args)["items"]
            good = [p for p in pods if p.get("status", {}).get("phase") == phase]
            result[:] = good
            if count is None:
                return bool(pods) and len(good) == len(pods)
            return len(good) >= count

        self._wait(ok, timeout, f"pods {phase}", interval=0.5)
        return result

    # ---------------------------------------------------------- clients

    def kubectl(
        self,
        *args,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float | None = 120,
        text: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run kubectl with the admin kubeconfig; returns CompletedProcess
        (stdout/stderr captured). Raises ClusterError if check and it fails."""
        cmd = [self.kubectl_bin or "kubectl", f"--kubeconfig={self.kubeconfig}", *map(str, args)]
        p = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, timeout=timeout)
        if check and p.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
        return p

    def apply(self, manifest: str | dict | list) -> None:
        """kubectl apply a YAML/JSON string or an object (or list of objects)."""
        if not isinstance(manifest, str):
            if isinstance(manifest, list):
                manifest = {"apiVersion": "v1", "kind": "List", "items": manifest}
            manifest = json.dumps(manifest)
        self.kubectl("apply", "-f", "-", input=manifest)

    def get_json(self, *args) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this cluster."""
        e = dict(os.environ)
        e["KUBECONFIG"] = str(self.kubeconfig)
        return e

    # ---------------------------------------------------------- nodes & exec

    def create_nodes(
        self,
        n: int = 16,
        gpus: int = 8,
        cpu: str = "32",
        memory: str = "256Gi",
        prefix: str = "node",
        pods: int = 110,
        taint: bool = False,
        labels: dict[str, str] | None = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> list[str]:
        """Create `n` kwok-managed fake nodes PREFIX-0..PREFIX-(n-1) with
        `gpus` nvidia.com/gpu (capacity and allocatable), wait until Ready.

        Nodes are labelled ``type=kwok`` and annotated
        ``kwok.x-k8s.io/node=fake``; with ``taint=True`` they also carry the
        usual ``kwok.x-k8s.io/node=fake:NoSchedule`` taint. Each node gets its
        own pod CIDR 127.65.I.0/24 (I = index; n <= 256), so a pod IP tells
        the node and is a loopback address.
        """
        if n > 256:
            raise ValueError("at most 256 nodes (one loopback /24 each)")
        names = []
        items = []
        for i in range(n):
            name = f"{prefix}-{i}"
            names.append(name)
            res = {"cpu": str(cpu), "memory": str(memory), "pods": str(pods)}
            if gpus:
                res["nvidia.com/gpu"] = str(gpus)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_KEY: KWOK_NODE_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/role": "agent",
                        **(labels or {}),
                    },
                },
                "spec": {"podCIDR": f"127.65.{i}.0/24", "podCIDRs": [f"127.65.{i}.0/24"]},
                # kwok's node-initialize stage keeps these and adds conditions
                "status": {"capacity": res, "allocatable": res},
            }
            if taint:
                node["spec"]["taints"] = [{"key": KWOK_NODE_KEY, "value": KWOK_NODE_VALUE, "effect": "NoSchedule"}]
            items.append(node)
        # a Node keeps the status it is created with (as when a kubelet
        # registers), so capacity is there before kwok first sees it
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        if wait:
            self.wait_nodes_ready(names, timeout=timeout)
        return names

    def longrunning_requests(self) -> dict[str, int]:
        """kube-apiserver's ``apiserver_longrunning_requests`` gauge, summed by verb and
        subresource (``"CONNECT pods/exec"``, ``"GET pods/log"``, ``"WATCH pods"``): the
        requests it holds open now (exec streams, followed logs, watches)."""
        counts: dict[str, int] = {}
        for line in self.kubectl("get", "--raw", "/metrics").stdout.splitlines():
            if not line.startswith("apiserver_longrunning_requests{"):
                continue
            labels_text, _, value = line.rpartition("} ")
            labels = dict(item.split("=", 1) for item in labels_text.split("{", 1)[1].split(",") if "=" in item)
            labels = {k: v.strip('"') for k, v in labels.items()}
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            key = f"{labels.get('verb', '')} {resource}"
            counts[key] = counts.get(key, 0) + int(float(value))
        return counts

    def set_pod_exec(
        self,
        pod: str,
        namespace: str = "default",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        containers: list[str] | None = None,
    ) -> None:
        """Give one pod its own exec target (a namespaced kwok ``Exec``
        object named like the pod): commands exec'd into it run in `workdir`
        with `env` added. Needs enable_exec_crd=True."""
        self.apply(self.pod_exec(pod, namespace, workdir, env, containers))

    def pod_exec(
        self,
        pod: str,
        namespace: str = "default",
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        containers: list[str] | None = None,
    ) -> dict:
        """The ``Exec`` object set_pod_exec applies (apply a list of them at once for many pods)."""
        envs = [{"name": MARKER_ENV, "value": self.marker}, *({"name": k, "value": v} for k, v in (env or {}).items())]
        local: dict = {"envs": envs, "workDir": str(workdir or self.exec_dir)}
        target: dict = {"local": local}
        if containers:
            target["containers"] = containers
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Exec",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"execs": [target]},
        }

    # ---------------------------------------------------------- state file

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
        c.pki = _PKI.__new__(_PKI)
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

    # helpers node.py builds on
    spawn = _spawn
    wait = _wait
    http_ok = _http_ok

    def kill_component(self, name: str) -> None:
        if name in self.pids:
            _kill_all([self.pids.pop(name)], None, timeout=10.0)
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
        _kill_all([pg], None, timeout=10.0)
    _kill_all(pgids, st.get("marker"), timeout=5.0)
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
