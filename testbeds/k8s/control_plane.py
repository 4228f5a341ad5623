"""Starting the testbed cluster's components (etcd, kube-apiserver and its token webhook,
controller manager, scheduler, kwok, pod runner), a part of :class:`~testbeds.k8s.cluster.KubeCluster`.

Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

from ..ports import free_port
from .binaries import KWOK_NODE_KEY, KWOK_NODE_VALUE, KWOK_VERSION, MARKER_ENV, b64_file, run_tool
from .common import cache_dir
from .network import POD_CIDR, SERVICE_CIDR, SERVICE_IP
from .pki import PKI


class ControlPlane:
    """The ``_start_*`` steps of ``KubeCluster.start`` and the credentials they make (mixed into it)."""

    def _make_pki(self) -> None:
        pki = PKI(self.workdir / "pki")
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
        run_tool(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", self.sa_key])
        run_tool(["openssl", "pkey", "-in", self.sa_key, "-pubout", "-out", self.sa_pub])

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
                certificate-authority-data: {b64_file(self.pki.ca_crt)}
            users:
            - name: {user}
              user:
                client-certificate-data: {b64_file(crt)}
                client-key-data: {b64_file(key)}
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
                            "cluster": {"server": self.server, "certificate-authority-data": b64_file(self.pki.ca_crt)},
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
