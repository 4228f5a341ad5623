"""A kubeconfig with static credentials is read without the kubernetes package's loader, and
reads the same as the loader reads it; anything else still goes to the loader.

``api.static_credentials`` saves each launch the 130 ms import of the loader. These tests
compare it with ``api.resolve`` through the real loader (``kubernetes`` 37) for each shape of
kubeconfig it accepts, and check that it declines the shapes only the loader can read.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mpilaunch.backends.k8s import api

pytest.importorskip("kubernetes")

CA, CERT, KEY = b"ca-pem\n", b"cert-pem\n", b"key-pem\n"


def b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode()


def kubeconfig(tmp_path, cluster: dict, user: dict, *, namespace=None, extra_contexts=()) -> str:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": context}, *extra_contexts],
    }
    path = tmp_path / "kube" / "config"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return str(path)


def through_the_loader(path, context, namespace, rundir) -> dict:
    """``resolve`` as it was before the static path: the kubernetes package's loader."""
    saved = api.static_credentials
    api.static_credentials = lambda *a: None
    try:
        return api.resolve(path, context, namespace, rundir)
    finally:
        api.static_credentials = saved


def contents(creds: dict) -> dict:
    """The credentials with each file replaced by what it holds (the two readers name files differently)."""
    return {k: (Path(v).read_bytes() if k.endswith("_file") else v) for k, v in creds.items()}


def both(tmp_path, path, context=None, namespace=None):
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast = api.static_credentials(path, context, namespace, tmp_path / "fast")
    assert fast is not None, "the static reader declined a kubeconfig it should read"
    slow = through_the_loader(path, context, namespace, tmp_path / "slow")
    return contents(fast), contents(slow)


def test_inline_client_certificate_and_ca(tmp_path):
    path = kubeconfig(
        tmp_path,
        {"server": "https://10.0.0.1:6443/", "certificate-authority-data": b64(CA)},
        {"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)},
        namespace="team",
    )
    fast, slow = both(tmp_path, path)
    assert (
        fast
        == slow
        == {"server": "https://10.0.0.1:6443", "namespace": "team", "ca_file": CA, "cert_file": CERT, "key_file": KEY}
    )


def test_token_with_ca_file_relative_to_the_kubeconfig_and_namespace_flag(tmp_path):
    (tmp_path / "kube").mkdir()
    (tmp_path / "kube" / "ca.crt").write_bytes(CA)
    path = kubeconfig(
        tmp_path,
        {"server": "https://api.example:443", "certificate-authority": "ca.crt", "tls-server-name": "kubernetes"},
        {"token": "s3cret"},
    )
    fast, slow = both(tmp_path, path, namespace="flag-ns")
    assert (
        fast
        == slow
        == {
            "server": "https://api.example:443",
            "namespace": "flag-ns",
            "ca_file": CA,
            "tls_server_name": "kubernetes",
            "token_file": b"s3cret",
        }
    )


def test_insecure_cluster_and_a_named_context(tmp_path):
    other = {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "o"}}
    (tmp_path / "k.pem").write_bytes(KEY)
    (tmp_path / "c.pem").write_bytes(CERT)
    path = kubeconfig(
        tmp_path,
        {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True},
        {"client-certificate": str(tmp_path / "c.pem"), "client-key": str(tmp_path / "k.pem")},
        extra_contexts=[other],
    )
    fast, slow = both(tmp_path, path, context="other")
    assert (
        fast
        == slow
        == {"server": "https://127.0.0.1:1", "namespace": "o", "insecure": True, "cert_file": CERT, "key_file": KEY}
    )


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}},
        {"auth-provider": {"name": "oidc"}},
        {"username": "a", "password": "b"},
        {"tokenFile": "/var/run/token"},
        {},
    ],
)
def test_what_only_the_loader_can_read_goes_to_it(tmp_path, user):
    path = kubeconfig(tmp_path, {"server": "https://127.0.0.1:1"}, user)
    assert api.static_credentials(path, None, None, tmp_path) is None


def test_several_files_a_missing_context_and_a_proxy_go_to_the_loader(tmp_path):
    path = kubeconfig(tmp_path, {"server": "https://127.0.0.1:1"}, {"token": "t"})
    assert api.static_credentials(path + os.pathsep + path, None, None, tmp_path) is None
    assert api.static_credentials(path, "nope", None, tmp_path) is None  # the loader names the choices
    proxied = kubeconfig(tmp_path, {"server": "https://127.0.0.1:1", "proxy-url": "http://p:3128"}, {"token": "t"})
    assert api.static_credentials(proxied, None, None, tmp_path) is None


def test_a_static_kubeconfig_does_not_import_the_kubernetes_package(tmp_path):
    path = kubeconfig(
        tmp_path, {"server": "https://10.0.0.1:6443", "certificate-authority-data": b64(CA)}, {"token": "t"}
    )
    code = (
        "import sys; from pathlib import Path; from mpilaunch.backends.k8s import api; "
        f"c = api.resolve({path!r}, None, None, Path({str(tmp_path)!r})); "
        "assert c['server'] == 'https://10.0.0.1:6443', c; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_broken_kubeconfig_is_left_to_the_loader_which_names_the_problem(tmp_path):
    from mpilaunch.core.errors import UsageError

    path = kubeconfig(
        tmp_path, {"server": "https://127.0.0.1:1", "certificate-authority": "missing.crt"}, {"token": "t"}
    )
    assert api.static_credentials(path, None, None, tmp_path) is None
    with pytest.raises(UsageError, match="cannot load kubeconfig"):
        api.resolve(path, None, None, tmp_path)
