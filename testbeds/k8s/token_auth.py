"""Short-lived bearer tokens for the testbed: an exec plugin that mints them, a webhook that checks them.

    python -m testbeds.k8s.token_auth webhook --port PORT --dir DIR
    python -m testbeds.k8s.token_auth plugin --secret-file DIR/secret --user NAME --lifetime 20 [--state S]

The kube-apiserver asks the webhook (``--authentication-token-webhook-config-file``)
about every bearer token it cannot check itself. A token is
``mpl1.<user>.<expires>.<nonce>.<mac>``, the mac an HMAC-SHA256 of the rest
under ``DIR/secret``; the webhook authenticates it as ``<user>`` (group
``mpilaunch-token-users``, bound to cluster-admin by the testbed) until
``<expires>``, the way EKS's IAM authenticator accepts its 15-minute tokens.
The apiserver caches answers for 1 s, so an expired token fails within 1 s.

Files steer the tests:
* ``DIR/revoked-users``: one user per line; the webhook rejects their tokens
  (a credential revoked while the plugin still hands out tokens).
* ``S/fail``: while it exists the plugin exits 1 and prints its content on
  stderr (a token service that went away); ``S/minted``: one line per token.

Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GROUP = "mpilaunch-token-users"
PREFIX = "mpl1"


def _mac(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def mint(secret: bytes, user: str, lifetime: float, now: float | None = None) -> tuple[str, float]:
    expires = (time.time() if now is None else now) + lifetime
    body = f"{PREFIX}.{user}.{expires:.3f}.{os.urandom(6).hex()}"
    return f"{body}.{_mac(secret, body)}", expires


def verify(secret: bytes, token: str, revoked: set[str], now: float | None = None) -> str | None:
    """The user a token authenticates, or None (forged, expired or revoked)."""
    parts = token.split(".")
    if len(parts) != 6 or parts[0] != PREFIX:  # mpl1 user expires(2 parts: "123.456") nonce mac
        return None
    body, mac = ".".join(parts[:5]), parts[5]
    if not hmac.compare_digest(_mac(secret, body), mac):
        return None
    user, expires = parts[1], float(f"{parts[2]}.{parts[3]}")
    if (time.time() if now is None else now) >= expires or user in revoked:
        return None
    return user


def write_webhook_kubeconfig(path: Path, port: int) -> Path:
    """The apiserver's view of the webhook: plain HTTP on loopback (a test bed, nothing to protect)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "token-webhook", "cluster": {"server": f"http://127.0.0.1:{port}/authenticate"}}],
                "users": [{"name": "apiserver", "user": {}}],
                "contexts": [{"name": "webhook", "context": {"cluster": "token-webhook", "user": "apiserver"}}],
                "current-context": "webhook",
            }
        )
    )
    return path


def exec_user(python: str, secret_file: Path, user: str, lifetime: float, state: Path) -> dict:
    """A kubeconfig ``users[].user`` entry whose exec plugin mints tokens valid ``lifetime`` seconds."""
    repo = str(Path(__file__).resolve().parents[2])
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": python,
            "args": [
                "-m",
                "testbeds.k8s.token_auth",
                "plugin",
                "--secret-file",
                str(secret_file),
                "--user",
                user,
                "--lifetime",
                f"{lifetime:g}",
                "--state",
                str(state),
            ],
            "env": [{"name": "PYTHONPATH", "value": repo}],
            "interactiveMode": "Never",
        }
    }


def _webhook(port: int, directory: Path) -> None:
    secret = (directory / "secret").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's naming
            review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            try:
                revoked = set((directory / "revoked-users").read_text().split())
            except OSError:
                revoked = set()
            user = verify(secret, (review.get("spec") or {}).get("token", ""), revoked)
            status = {"authenticated": False}
            if user:
                status = {"authenticated": True, "user": {"username": user, "groups": [GROUP, "system:authenticated"]}}
            body = json.dumps(
                {
                    "apiVersion": review.get("apiVersion", "authentication.k8s.io/v1"),
                    "kind": "TokenReview",
                    "status": status,
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet: the apiserver asks often
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _plugin(secret_file: Path, user: str, lifetime: float, state: Path) -> int:
    fail = state / "fail"
    if fail.exists():
        print(fail.read_text().strip() or "token service unavailable", file=sys.stderr)
        return 1
    token, expires = mint(secret_file.read_bytes(), user, lifetime)
    with open(state / "minted", "a") as f:
        f.write(f"{time.time():.3f} {expires:.3f}\n")
    stamp = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(
        json.dumps(
            {
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {"token": token, "expirationTimestamp": stamp},
            }
        )
    )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbeds.k8s.token_auth")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("webhook")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--dir", type=Path, required=True)
    g = sub.add_parser("plugin")
    g.add_argument("--secret-file", type=Path, required=True)
    g.add_argument("--user", required=True)
    g.add_argument("--lifetime", type=float, default=20.0)
    g.add_argument("--state", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "webhook":
        _webhook(a.port, a.dir)
        return 0
    return _plugin(a.secret_file, a.user, a.lifetime, a.state)


if __name__ == "__main__":
    sys.exit(main())
