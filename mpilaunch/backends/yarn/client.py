"""Talking to the ResourceManager: a skein client with fresh credentials, and reading its states.

And an application's own credentials (``application_security``), for its key-value store.
"""

from __future__ import annotations

import os
import re

import skein

from ...core.errors import AllocationError, UsageError

TERMINAL_STATES = ("FINISHED", "FAILED", "KILLED")
TAG = "mpilaunch"  # what yarn.py's ApplicationSpec tags every job's application with


def is_mpilaunch(report) -> bool:
    """An application mpilaunch submitted: it carries the ``mpilaunch`` tag (YARN lowercases tags)."""
    return TAG in {t.lower() for t in (report.tags or ())}


def state_name(value) -> str:
    return str(value).rsplit(".", 1)[-1]


def shorten(text: str | None, limit: int = 400) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Client(skein.Client):
    # skein's __del__ closes the driver process it reads from _proc, which its __init__ sets only
    # once the driver has started: a Client whose driver failed to start printed an
    # AttributeError traceback ("Exception ignored in ... __del__") under mpilaunch's one line.
    _proc = None


def skein_client(log=False) -> "skein.Client":
    try:
        # Fresh credentials for our own driver: nothing written to ~/.skein.
        return _Client(log=log, security=skein.Security.new_credentials())
    except (skein.exceptions.DriverError, skein.exceptions.SkeinError, OSError) as e:
        raise AllocationError(
            f"cannot start the skein driver to talk to YARN: {shorten(str(e))}",
            "check JAVA_HOME, HADOOP_CONF_DIR and that `yarn classpath --glob` works on this machine",
        ) from None


# ------------------------------------------------------------------ an application's own credentials

#: where skein's driver stages an application's TLS credentials, under its submitter's home directory
#: in the cluster's default file system (``~/.skein/<app id>``, mode 0700: its owner's alone); the
#: ApplicationMaster and every container use them, and so does a client of its key-value store
CREDENTIAL_FILES = (".skein.crt", ".skein.pem")
_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----\s*", re.S)


def fs_cat_command(java: str, classpath: str, java_options: str, paths) -> list[str]:
    """Hadoop's ``fs -cat`` (FsShell) as skein's driver runs Java: the JVM, its options
    (``SKEIN_DRIVER_JAVA_OPTIONS``) and ``yarn classpath --glob`` (Hadoop's configuration with it)."""
    return [java, *java_options.split(), "-cp", classpath, "org.apache.hadoop.fs.FsShell", "-cat", *paths]


def split_pem(data: bytes) -> tuple[bytes, bytes]:
    """(certificate, private key) from the two PEM files' text one after the other; ValueError when
    either is missing."""
    blocks = {m[1]: m[0].strip() + b"\n" for m in _PEM.finditer(data)}
    cert = blocks.get(b"CERTIFICATE")
    key = next((v for k, v in blocks.items() if k.endswith(b"PRIVATE KEY")), None)
    if cert is None or key is None:
        raise ValueError("no certificate and private key in what was read")
    return cert, key


def application_security(app_id: str) -> "skein.Security":
    """The credentials of application ``app_id`` (its submitter's: ``CREDENTIAL_FILES``), read from
    the cluster's file system as this user; a UsageError where they cannot be."""
    import subprocess

    hint = (
        "only the user who submitted the job can ask its launcher; check JAVA_HOME, HADOOP_CONF_DIR and "
        "that `yarn classpath --glob` works on this machine"
    )
    paths = [f".skein/{app_id}/{name}" for name in CREDENTIAL_FILES]
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        classpath = subprocess.run(
            ["yarn", "classpath", "--glob"], capture_output=True, check=True, timeout=60
        ).stdout.decode()
        command = fs_cat_command(java, classpath.strip(), os.environ.get("SKEIN_DRIVER_JAVA_OPTIONS", ""), paths)
        read = subprocess.run(command, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(
            f"cannot read the credentials of YARN application {app_id}: {shorten(str(e), 200)}", hint
        ) from None
    if read.returncode != 0:
        said = [line for line in read.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise UsageError(
            f"cannot read the credentials of YARN application {app_id} (~/{paths[0].rsplit('/', 1)[0]}): "
            + shorten(said[-1] if said else f"hadoop fs -cat exited {read.returncode}", 200),
            hint,
        )
    try:
        cert, key = split_pem(read.stdout)
    except ValueError as e:
        raise UsageError(f"cannot read the credentials of YARN application {app_id}: {e}", hint) from None
    return skein.Security(cert_bytes=cert, key_bytes=key)
