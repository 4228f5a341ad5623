"""Credentials and a small REST client for the Kubernetes backend.

Credentials are resolved the way kubectl resolves them (``--kubeconfig``,
else ``$KUBECONFIG``, else ``~/.kube/config``; ``--context``, else the
current context; the namespace from ``--namespace``, else the context, else
the pod's own namespace in-cluster, else ``default``) with the ``kubernetes``
package's loader, which also runs exec plugins and auth providers. The result
is flattened into files under the job's runtime directory (mode 0600) and a
dict that is both this client's configuration and the shim's exec context,
so every ``mpilaunch-rsh`` reuses them without a client library.

Inside a pod (the cluster launcher) no kubeconfig is needed: the
ServiceAccount's token and CA are read from ``$MPILAUNCH_K8S_SA_DIR``
(default ``/var/run/secrets/kubernetes.io/serviceaccount``) and the server
from ``KUBERNETES_SERVICE_HOST/PORT``; that path imports nothing but stdlib.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
from pathlib import Path

from ..errors import UsageError
from ..rsh_agent.transports import k8s as transport

SA_DIR_ENV = "MPILAUNCH_K8S_SA_DIR"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


def sa_dir() -> str:
    return os.environ.get(SA_DIR_ENV) or transport.SA_DIR


def in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(os.path.join(sa_dir(), "token"))


def _write_private(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return str(path)


def _kubeconfig_paths(explicit: str | None) -> str:
    if explicit:
        return explicit
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _kubeconfig_exists(paths: str) -> bool:
    return any(p and os.path.exists(p) for p in paths.split(os.pathsep))


def resolve(kubeconfig: str | None, context: str | None, namespace: str | None, rundir: Path | None) -> dict:
    """Credentials + namespace as a flat dict (see module doc). Files go to ``rundir``."""
    paths = _kubeconfig_paths(kubeconfig)
    if not _kubeconfig_exists(paths) and not kubeconfig and not context and in_cluster_available():
        ns = namespace
        if not ns:
            try:
                ns = Path(sa_dir(), "namespace").read_text().strip()
            except OSError:
                ns = None
        return {"in_cluster": True, "sa_dir": sa_dir(), "namespace": ns or "default"}
    if not _kubeconfig_exists(paths):
        raise UsageError(
            f"no kubeconfig found ({paths})",
            "pass --kubeconfig, set KUBECONFIG, or run inside a pod with a ServiceAccount",
        )
    try:
        from kubernetes import client as kclient
        from kubernetes import config as kconfig
    except ImportError:
        raise UsageError("the k8s backend needs the Python package 'kubernetes'", "pip install 'mpilaunch[k8s]'") from None
    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=paths)
        if context:
            chosen = next((c for c in contexts if c["name"] == context), None)
            if chosen is None:
                names = ", ".join(c["name"] for c in contexts) or "none"
                raise UsageError(f"context {context!r} not in {paths}", f"choose one of: {names}")
        else:
            chosen = active
        cfg = kclient.Configuration()
        tmp = str(rundir) if rundir is not None else None
        kconfig.load_kube_config(config_file=paths, context=context, client_configuration=cfg,
                                 persist_config=False, temp_file_path=tmp)
    except UsageError:
        raise
    except Exception as e:  # the loader raises ConfigException, ValueError, OSError...
        raise UsageError(f"cannot load kubeconfig {paths}: {e}", "check the file with 'kubectl config view'") from None
    ns = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
    creds: dict = {"server": cfg.host.rstrip("/"), "namespace": ns}
    if not cfg.verify_ssl:
        creds["insecure"] = True
    if getattr(cfg, "tls_server_name", None):
        creds["tls_server_name"] = cfg.tls_server_name
    files = {"ca_file": cfg.ssl_ca_cert, "cert_file": cfg.cert_file, "key_file": cfg.key_file}
    for key, src in files.items():
        if not src:
            continue
        if rundir is None:
            creds[key] = src
        else:
            creds[key] = _write_private(rundir / f"k8s-{key.replace('_file', '')}.pem", Path(src).read_bytes())
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth is None and getattr(cfg, "refresh_api_key_hook", None):
        cfg.refresh_api_key_hook(cfg)
        auth = (cfg.api_key or {}).get("authorization")
    if auth:
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        if rundir is None:
            creds["token"] = token
        else:
            creds["token_file"] = _write_private(rundir / "k8s-token", token.encode())
    elif cfg.username and cfg.password:
        raise UsageError("basic-auth kubeconfig users are not supported", "use a token or client certificate")
    return creds


class Api:
    """Minimal JSON REST client (one keep-alive connection per thread)."""

    def __init__(self, creds: dict, timeout: float = 30.0):
        self.creds = creds
        self.namespace = creds.get("namespace") or "default"
        self.host, self.port, _ = transport.server_address(creds)
        self.timeout = timeout
        self._ssl = transport.ssl_context(creds)
        self._local = threading.local()

    def _token(self) -> str | None:
        if "token" in self.creds:
            return self.creds["token"]
        return transport.bearer_token(self.creds)

    def _conn(self, fresh: bool = False) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body=None, query: dict | None = None,
                content_type: str = "application/json", stream: bool = False, timeout: float | None = None):
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        headers = {"Accept": "application/json", "User-Agent": "mpilaunch"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if stream:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout or self.timeout, context=self._ssl)
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 400:
                raw = resp.read()
                conn.close()
                raise self._error(resp.status, resp.reason, raw)
            return conn, resp
        for attempt in range(3):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.RemoteDisconnected, http.client.CannotSendRequest, ConnectionResetError,
                    BrokenPipeError, http.client.ResponseNotReady):
                if attempt == 2:
                    raise
                time.sleep(0.1)
        if resp.status >= 400:
            raise self._error(resp.status, resp.reason, raw)
        return json.loads(raw) if raw else {}

    @staticmethod
    def _error(status: int, reason: str, raw: bytes) -> ApiError:
        try:
            body = json.loads(raw)
            message = body.get("message") or raw.decode(errors="replace")
        except ValueError:
            body, message = None, raw.decode(errors="replace").strip()
        return ApiError(status, reason, message, body)

    # -- object paths
    @staticmethod
    def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"

    def get(self, api_version: str, plural: str, name: str | None = None, namespace: str | None = "", **query):
        ns = self.namespace if namespace == "" else namespace
        path = self.collection_path(api_version, plural, ns)
        if name:
            path += f"/{name}"
        return self.request("GET", path, query=query or None)

    def create(self, obj: dict, **query) -> dict:
        api_version, plural = obj["apiVersion"], PLURALS[obj["kind"]]
        ns = obj["metadata"].get("namespace", self.namespace)
        return self.request("POST", self.collection_path(api_version, plural, ns), body=obj, query=query or None)

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = "", **body) -> None:
        ns = self.namespace if namespace == "" else namespace
        path = self.collection_path(api_version, plural, ns) + f"/{name}"
        try:
            self.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1", **body})
        except ApiError as e:
            if e.status != 404:
                raise

    def patch(self, api_version: str, plural: str, name: str, body: dict, namespace: str | None = "") -> dict:
        """A JSON merge patch (RFC 7386): only the fields given change."""
        ns = self.namespace if namespace == "" else namespace
        path = self.collection_path(api_version, plural, ns) + f"/{name}"
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def delete_collection(self, api_version: str, plural: str, selector: str, **body) -> None:
        path = self.collection_path(api_version, plural, self.namespace)
        try:
            self.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1", **body},
                         query={"labelSelector": selector})
        except ApiError as e:
            if e.status not in (404, 405):
                raise


PLURALS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Service": "services",
    "Pod": "pods",
    "Job": "jobs",
    "PodGroup": "podgroups",
    "Event": "events",
    "Lease": "leases",
}
