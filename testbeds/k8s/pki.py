"""The testbed cluster's certificates, made with the ``openssl`` CLI. Stdlib only."""

from __future__ import annotations

import os
from pathlib import Path

from .binaries import run_tool

# --------------------------------------------------------------------------
# PKI


class PKI:
    """CA + certificates made with the openssl CLI (EC P-256: fast)."""

    def __init__(self, d: Path):
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        self.ca_crt = d / "ca.crt"
        self.ca_key = d / "ca.key"

    def _key(self, path: Path) -> None:
        # PKCS#8, which every component accepts
        run_tool(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path])
        os.chmod(path, 0o600)

    def make_ca(self) -> None:
        self._key(self.ca_key)
        run_tool(
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
        run_tool(["openssl", "req", "-new", "-key", key, "-subj", subj, "-out", csr])
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
        run_tool(
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
