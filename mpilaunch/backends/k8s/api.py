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

import contextlib
import http.client
import json
import logging
import os
import ssl
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from ...core import env_names
from ...core.errors import UsageError
from .exec_path import exec_stream

# typing.TYPE_CHECKING without importing typing (~2 ms of every launch): the annotations' names only
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .credentials import TokenSource

SA_DIR_ENV = env_names.K8S_SA_DIR


def broken_off(error: http.client.HTTPException) -> ConnectionError:
    """An answer from the API server that broke off, as the OSError callers already handle (an
    outage, not a verdict: http.client raises IncompleteRead, BadStatusLine, which are not OSErrors)."""
    return ConnectionError(f"the API server's answer broke off ({type(error).__name__})")


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


def sa_dir() -> str:
    return os.environ.get(SA_DIR_ENV) or exec_stream.SA_DIR


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
    return resolve_with_tokens(kubeconfig, context, namespace, rundir)[0]


def resolve_with_tokens(
    kubeconfig: str | None, context: str | None, namespace: str | None, rundir: Path | None
) -> tuple[dict, "TokenSource | None"]:
    """``resolve``, plus the TokenSource that keeps an exec plugin's token fresh (None: nothing expires)."""
    paths = _kubeconfig_paths(kubeconfig)
    if not _kubeconfig_exists(paths) and not kubeconfig and not context and in_cluster_available():
        ns = namespace
        if not ns:
            try:
                ns = Path(sa_dir(), "namespace").read_text().strip()
            except OSError:
                ns = None
        return {"in_cluster": True, "sa_dir": sa_dir(), "namespace": ns or "default"}, None
    if not _kubeconfig_exists(paths):
        raise UsageError(
            f"no kubeconfig found ({paths})",
            "pass --kubeconfig, set KUBECONFIG, or run inside a pod with a ServiceAccount",
        )
    static = static_credentials(paths, context, namespace, rundir)
    if static is not None:
        return static, None
    try:
        from kubernetes import client as kclient
        from kubernetes.config import kube_config
    except ImportError:
        raise UsageError(
            "the k8s backend needs the Python package 'kubernetes'", "pip install 'mpilaunch[k8s]'"
        ) from None
    from . import credentials

    try:
        merged = kube_config.KubeConfigMerger(paths)
        if merged.config is None:
            raise kube_config.ConfigException("no configuration found")
        if context:
            names = [c["name"] for c in (merged.config.safe_get("contexts") or [])]
            if context not in names:
                raise UsageError(f"context {context!r} not in {paths}", f"choose one of: {', '.join(names) or 'none'}")
        loader = kube_config.KubeConfigLoader(
            config_dict=merged.config,
            active_context=context,
            config_base_path=None,
            temp_file_path=str(rundir) if rundir is not None else None,
        )
        chosen = loader.current_context
        cfg = kclient.Configuration()
        with _quiet_loader_log():  # a failing exec plugin is logged there, then named by us below
            loader.load_and_set(cfg)
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
    plugin = credentials.exec_plugin_fetcher(paths, (chosen or {}).get("name"))
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if plugin is not None and not auth and not cfg.cert_file:
        plugin[0]()  # the loader swallowed the plugin's failure: run it again for the error (exit 3)
    if auth:
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        if rundir is None:
            creds["token"] = token
        else:
            creds["token_file"] = _write_private(rundir / "k8s-token", token.encode())
    elif cfg.username and cfg.password:
        raise UsageError("basic-auth kubeconfig users are not supported", "use a token or client certificate")
    tokens = None
    if plugin is not None and auth:
        fetch, describe = plugin
        expiry = getattr(loader, "expiry", None)  # set by the loader from the plugin's expirationTimestamp
        first = credentials.Token(token, time.time(), expiry.timestamp() if expiry is not None else None)
        tokens = credentials.TokenSource(
            fetch, first, Path(creds["token_file"]) if "token_file" in creds else None, describe
        )
    return creds, tokens


# What a kubeconfig's cluster and user may hold for static_credentials to read it: anything
# else (exec plugins, auth providers, basic auth, proxies, impersonation, token files, several
# files to merge) is the kubernetes package's loader's to read.
_STATIC_CLUSTER_KEYS = {
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "tls-server-name",
    "extensions",
}
_STATIC_USER_KEYS = {
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "token",
    "extensions",
}


def static_credentials(paths: str, context: str | None, namespace: str | None, rundir: Path | None) -> dict | None:
    """``resolve``'s result for a kubeconfig that needs no loader; None for any other.

    One file whose context's user holds a token or a client certificate and nothing that runs
    or refreshes anything: the common case, read with the YAML parser mpilaunch has loaded
    anyway. Importing the ``kubernetes`` package for its loader costs 130 ms, before the first
    object of a job can be created (tests/unit/test_k8s_static_credentials.py: both readers
    give the same credentials for every shape this one takes)."""
    if os.pathsep in paths:
        return None
    import yaml

    try:
        with open(paths, "rb") as f:
            config = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        name = context or config.get("current-context")
        chosen = _named(config.get("contexts"), name)
        cluster = _named(config.get("clusters"), chosen["cluster"])
        user = _named(config.get("users"), chosen["user"])
    except Exception:  # unreadable or unusual: the loader reads it and says what is wrong
        return None
    if (
        cluster is None
        or user is None
        or not isinstance(cluster.get("server"), str)
        or not set(cluster) <= _STATIC_CLUSTER_KEYS
        or not set(user) <= _STATIC_USER_KEYS
        or ("token" not in user and "client-certificate" not in user and "client-certificate-data" not in user)
    ):
        return None
    base = os.path.dirname(os.path.abspath(paths))
    creds: dict = {
        "server": cluster["server"].rstrip("/"),
        "namespace": namespace or chosen.get("namespace") or "default",
    }
    if cluster.get("insecure-skip-tls-verify"):
        creds["insecure"] = True
    if cluster.get("tls-server-name"):
        creds["tls_server_name"] = cluster["tls-server-name"]
    for key, name, holder, field in (
        ("ca_file", "ca", cluster, "certificate-authority"),
        ("cert_file", "cert", user, "client-certificate"),
        ("key_file", "key", user, "client-key"),
    ):
        if holder.get(field + "-data") and rundir is None:
            return None  # no private directory for its file: the loader's temporary files
        try:
            if holder.get(field + "-data"):
                import base64

                data = base64.standard_b64decode(holder[field + "-data"])
                creds[key] = _write_private(rundir / f"k8s-{name}.pem", data)
            elif holder.get(field):
                src = os.path.join(base, holder[field])
                creds[key] = (
                    src if rundir is None else _write_private(rundir / f"k8s-{name}.pem", Path(src).read_bytes())
                )
        except (OSError, ValueError):  # a missing file, bad base64: the loader's error names it
            return None
    if user.get("token"):
        if rundir is None:
            creds["token"] = user["token"]
        else:
            creds["token_file"] = _write_private(rundir / "k8s-token", user["token"].encode())
    return creds


def _named(entries, name):
    """The ``cluster``/``user``/``context`` body of the entry called ``name`` in a kubeconfig list."""
    for entry in entries or []:
        if entry.get("name") == name:
            return entry.get("context") or entry.get("cluster") or entry.get("user")
    return None


def client(kubeconfig: str | None, context: str | None, namespace: str | None) -> "Api":
    """An Api for a command that may run long (``logs -f``, ``wait``): its token is kept fresh."""
    creds, tokens = resolve_with_tokens(kubeconfig, context, namespace, None)
    return Api(creds, tokens=tokens.start() if tokens is not None else None)


@contextlib.contextmanager
def _quiet_loader_log():
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


class Api:
    """Minimal JSON REST client (one keep-alive connection per thread)."""

    def __init__(self, creds: dict, timeout: float = 30.0, tokens=None):
        self.creds = creds
        self.tokens = tokens  # a credentials.TokenSource when the token expires
        self.namespace = creds.get("namespace") or "default"
        self.host, self.port, _ = exec_stream.server_address(creds)
        self.timeout = timeout
        self._ssl = exec_stream.ssl_context(creds)
        self._local = threading.local()

    def _token(self) -> str | None:
        if self.tokens is not None:
            return self.tokens.current()
        if "token" in self.creds:
            return self.creds["token"]
        return exec_stream.bearer_token(self.creds)

    def _conn(self, fresh: bool = False) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body=None,
        query: dict | None = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | None = None,
    ):
        """One request; a 401 with an expiring token fetches a new one and sends the request once more.

        A 401 that stays is raised as a CredentialError (exit 3, one line):
        it is never an answer to read as "nothing there"."""
        token = self._token()
        try:
            return self._request(method, path, body, query, content_type, stream, timeout, token)
        except ApiError as e:
            if e.status != 401:
                raise
            if self.tokens is not None and self.tokens.after_unauthorized(token):
                try:
                    return self._request(method, path, body, query, content_type, stream, timeout, self._token())
                except ApiError as again:
                    if again.status != 401:
                        raise
                    e = again
            from .credentials import refused

            raise refused(401, e.message, f"{method} {path.split('?')[0]}") from None

    def check_credentials(self) -> None:
        """Raise the CredentialError once the token source gave up (a running job's watchers ask)."""
        if self.tokens is not None:
            self.tokens.check()

    def _request(self, method, path, body, query, content_type, stream, timeout, token):
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        headers = {"Accept": "application/json", "User-Agent": "mpilaunch"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if stream:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout or self.timeout, context=self._ssl)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
            except http.client.HTTPException as e:
                conn.close()
                raise broken_off(e) from e
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
            except (
                http.client.RemoteDisconnected,
                http.client.CannotSendRequest,
                ConnectionResetError,
                BrokenPipeError,
                http.client.ResponseNotReady,
                ssl.SSLEOFError,
            ):
                # a kept-alive connection the server closed while idle (the apiserver does after
                # about 90 s): the request never reached it, so it is sent again on a new one
                if attempt == 2:
                    raise
                time.sleep(0.1)
            except http.client.HTTPException as e:
                # the answer broke off (IncompleteRead: the server went away mid-response, as in an
                # outage): an OSError like every other failure to reach it, which callers ride out
                raise broken_off(e) from e
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
            self.request(
                "DELETE",
                path,
                body={"kind": "DeleteOptions", "apiVersion": "v1", **body},
                query={"labelSelector": selector},
            )
        except ApiError as e:
            if e.status not in (404, 405):
                raise


class ApiOutage:
    """Calls to the API server failing in a row: no verdict on the job, but never silent.

    The first SAY_AFTER_S seconds of failures pass quietly (a leader
    election, a restarting apiserver); then one warning line, and one more
    when the server answers again.
    """

    SAY_AFTER_S = 30.0

    def __init__(self, what: str, clock=time.monotonic, stream=None):
        self.what = what
        self.clock = clock
        self.stream = stream
        self.since: float | None = None
        self.said = False

    def ok(self) -> None:
        if self.said:
            print(f"mpilaunch: the API server answers again about {self.what}", file=self.stream or sys.stderr)
        self.since, self.said = None, False

    def failed(self, error: Exception) -> None:
        now = self.clock()
        self.since = now if self.since is None else self.since
        if not self.said and now - self.since >= self.SAY_AFTER_S:
            self.said = True
            print(
                f"mpilaunch: warning: cannot read {self.what} for {now - self.since:.0f}s "
                f"({str(error)[:200]}); still trying",
                file=self.stream or sys.stderr,
            )
        return None


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
    "NetworkPolicy": "networkpolicies",
}


def creation_hint(e: ApiError) -> str:
    """The hint for an object the API server would not create."""
    from .refusals import explain

    policy = explain(e.message)
    if policy is not None:  # a quota, LimitRange or PodSecurity refusal is a 403 too, but no permission
        return policy[1]
    if e.status == 403:
        return "your credentials lack a permission (see the message); ask the cluster admin or use another --namespace"
    if e.status == 422:
        return "the cluster rejected an object; check --node-selector/--toleration/--priority-class values"
    return "check the API server and your kubeconfig"
