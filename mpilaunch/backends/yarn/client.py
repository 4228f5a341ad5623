"""Talking to the ResourceManager: a skein client with fresh credentials, and reading its states."""

from __future__ import annotations

import skein

from ...core.errors import AllocationError

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
