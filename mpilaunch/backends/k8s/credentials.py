"""Bearer tokens that expire: fetched again before they do, and after a 401.

A kubeconfig user with an exec plugin (``users[].user.exec``: EKS's
``aws eks get-token`` hands out 15-minute tokens, GKE's plugin about an
hour's) gets a token with an ``expirationTimestamp``. mpilaunch keeps one
``TokenSource`` per process that talks to the API server on the submitting
side: the Api client asks it for the token of every request, a thread runs
the plugin again once half of the token's life is gone, and the token file
the exec relay and every ``mpilaunch-rsh`` read at each connect is replaced
whole (rename) at each refresh. A 401 makes the source fetch a token at once
and the request is sent once more.

When the plugin keeps failing, the source gives up while the last token is
still valid (``give_up_at``): the job is then stopped and released with that
token, and the error names the plugin and what it said. The launcher pod
needs none of this: it reads its projected ServiceAccount token, which the
kubelet rotates in place, at every request (``transports/k8s.bearer_token``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...core.errors import AllocationError

# Fetch again once this share of the token's lifetime is gone (client-go
# refreshes only when a token has expired; a running job cannot wait for that).
REFRESH_AFTER = 0.5
# Give up when less than this is left (at least GIVE_UP_MIN_S): enough to stop
# the job and delete its objects with the token still valid. 5 s was not enough
# on a loaded 2-core machine (load 20: the token expired between the pods' delete
# and the services' list, 2026-11-28); tokens of a real cluster live minutes to
# hours, where the share decides.
GIVE_UP_SHARE = 0.25
GIVE_UP_MIN_S = 10.0
RETRY_S = 1.0
HINT = "check that your kubeconfig's credentials work ('kubectl auth whoami'), then run the job again"


class CredentialError(AllocationError):
    """The cluster's credentials failed: no token, or the API server refused it (exit 3)."""


@dataclass(frozen=True)
class Token:
    value: str
    issued: float  # time.time() when fetched
    expires: float | None  # time.time() of its expirationTimestamp; None: not said


def refresh_at(token: Token) -> float | None:
    """When to fetch the next token (None: only after a 401)."""
    if token.expires is None:
        return None
    return token.issued + REFRESH_AFTER * max(0.0, token.expires - token.issued)


def give_up_at(token: Token) -> float | None:
    """The last moment to stop trying: after it the job is released while ``token`` still works."""
    if token.expires is None:
        return None
    lifetime = max(0.0, token.expires - token.issued)
    return token.expires - max(GIVE_UP_MIN_S, GIVE_UP_SHARE * lifetime)


def refused(status: int, message: str, what: str) -> CredentialError:
    """The one line for a 401/403 on the job's own objects."""
    why = (
        "rejected the credentials (401 Unauthorized)"
        if status == 401
        else f"forbids it (403 Forbidden: {message[:200]})"
    )
    return CredentialError(f"cluster credentials failed: {what}: the API server {why}", HINT)


def write_token_file(path: Path, value: str) -> None:
    """Replace the token file whole: a shim reading it mid-refresh gets the old token or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)


class TokenSource:
    """The current bearer token of an exec-plugin user, refreshed in the background.

    ``fetch()`` returns a new Token or raises CredentialError. ``failure``
    becomes that error once the source gave up; ``on_failure`` callbacks hear
    it once. The token file (when given) always holds the current token.
    """

    def __init__(
        self,
        fetch: Callable[[], Token],
        first: Token,
        token_file: Path | None = None,
        describe: str = "the kubeconfig's exec plugin",
        clock=time.time,
    ):
        self.fetch = fetch
        self.token = first
        self.token_file = token_file
        self.describe = describe
        self.clock = clock
        self.failure: CredentialError | None = None
        self.refreshes = 0
        self.on_failure: list[Callable[[CredentialError], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    # ------------------------------------------------------------ used by the Api client

    def current(self) -> str:
        return self.token.value

    def after_unauthorized(self, used: str) -> bool:
        """A request with ``used`` got 401: fetch a token now. True: send the request again."""
        with self._lock:
            if self.token.value != used:
                return True  # another thread refreshed meanwhile
            try:
                self._store(self.fetch())
            except CredentialError as e:
                self._fail(e)
                return False
        return True

    def check(self) -> None:
        """Raise the failure once the source gave up (the watchers of a running job call this)."""
        if self.failure is not None:
            raise self.failure

    # ------------------------------------------------------------ background refresh

    def start(self) -> "TokenSource":
        if self.token.expires is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="k8s-token-refresh", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set() and self.failure is None:
            due = refresh_at(self.token)
            if due is None:
                return
            if self._stop.wait(max(0.0, due - self.clock())):
                return
            self._refresh_until_given_up()

    def _refresh_until_given_up(self) -> None:
        token = self.token
        while not self._stop.is_set():
            try:
                fresh = self.fetch()
            except CredentialError as e:
                last = give_up_at(token)
                if last is not None and self.clock() >= last:
                    self._fail(e)
                    return
                if not self._warned:
                    self._warned = True
                    left = (token.expires or self.clock()) - self.clock()
                    print(
                        f"mpilaunch: warning: {e.message}; trying again until the current token expires in {left:.0f}s",
                        file=sys.stderr,
                    )
                self._stop.wait(RETRY_S)
                continue
            with self._lock:
                self._store(fresh)
            return

    def _store(self, token: Token) -> None:
        self.token = token
        self.refreshes += 1
        if self.token_file is not None:
            write_token_file(self.token_file, token.value)

    def _fail(self, error: CredentialError) -> None:
        if self.failure is not None:
            return
        self.failure = error
        for callback in list(self.on_failure):
            try:
                callback(error)
            except Exception:  # a listener must not break the others
                pass


# ------------------------------------------------------------ the kubeconfig's exec plugin


def _expiry(status: dict) -> float | None:
    stamp = status.get("expirationTimestamp")
    if not stamp:
        return None
    from kubernetes.config.dateutil import parse_rfc3339

    return parse_rfc3339(stamp).timestamp()


def exec_plugin_fetcher(paths: str, context_name: str | None) -> tuple[Callable[[], Token], str] | None:
    """A fetch function for the context's exec-plugin user, and its description; None when it has none.

    The plugin runs through the kubernetes client's ExecProvider (the same
    input, ``KUBERNETES_EXEC_INFO``, and output checks as at load time).
    """
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.exec_provider import ExecProvider
    from kubernetes.config.kube_config import KubeConfigMerger

    config = KubeConfigMerger(paths).config
    if config is None:
        return None
    name = context_name or config.safe_get("current-context")
    try:
        context = config["contexts"].get_with_name(name)["context"]
        user = config["users"].get_with_name(context["user"])["user"]
        cluster = config["clusters"].get_with_name(context["cluster"])["cluster"]
    except (ConfigException, KeyError, TypeError):
        return None
    if "exec" not in user:
        return None
    plugin = user["exec"]
    command = plugin.safe_get("command") or "?"
    describe = f"the kubeconfig's exec plugin {os.path.basename(str(command))!r}"
    base_path = os.path.dirname(os.path.abspath(user.path)) if getattr(user, "path", None) else None

    def fetch() -> Token:
        issued = time.time()
        try:
            status = ExecProvider(plugin, base_path, cluster).run()
        except ConfigException as e:
            raise CredentialError(f"cluster credentials failed: {describe} failed ({str(e)[:300]})", HINT) from None
        except OSError as e:
            raise CredentialError(f"cluster credentials failed: cannot run {describe} ({e})", HINT) from None
        if not status.get("token"):
            raise CredentialError(f"cluster credentials failed: {describe} gave no token", HINT)
        return Token(status["token"], issued, _expiry(status))

    return fetch, describe
