"""Ownership in the cluster, YARN: the heartbeat key and the reaper in the ApplicationMaster's container.

While attached, the submitting mpilaunch writes the time into the key
``<prefix>heartbeat`` of skein's key-value store every few seconds. The
application's *driver* (skein's ``Master(script=...)``, a process in the
ApplicationMaster's container, so it runs from the moment the application
does, before any worker container is allocated) runs
:mod:`mpilaunch.backends.yarn.in_cluster.driver`: it ends the application when the key
has not changed for ``--orphan-timeout`` (final status KILLED) or the job
passed its cluster-side deadline (FAILED), each with a diagnostic saying so.
YARN then kills every container. When the job ends normally the submitting
side shuts the application down, driver included.
"""

from __future__ import annotations

import time

import skein

from ...core import env_names
from ...core.orphan import cluster_deadline_s
from ..heartbeat import Heartbeat
from . import tools

HEARTBEAT_KEY = "heartbeat"
REAPER_MODULE = "mpilaunch.backends.yarn.in_cluster.driver"


def reaper_env(spec) -> dict[str, str]:
    """What the driver needs besides the service environment: its timeout and deadline."""
    env = {env_names.ORPHAN_TIMEOUT: f"{spec.orphan_timeout:g}"}
    deadline_s = cluster_deadline_s(spec.start_timeout, spec.timeout)
    if deadline_s is not None:
        env[env_names.DEADLINE_S] = str(deadline_s)
    return env


def master(backend, resources, security, files: dict) -> "skein.Master":
    """The ApplicationMaster, with the reaper as its driver (run the way the backend runs its services).

    A detached job has none: no heartbeat is renewed once mpilaunch exits,
    and its launcher container ends the application (``--timeout`` too).
    With ``--env-archive`` its driver checks the archive, then holds (``tools.py``).
    """
    if backend.spec.detach:
        if not backend.opts.env_archive:
            return skein.Master(resources=resources, security=security)
        return skein.Master(
            resources=resources,
            security=security,
            files=files,
            script=tools.service_script(None),
            env=backend.service_env(),
        )
    return skein.Master(
        resources=resources,
        security=security,
        files=files,
        script=backend.service_script(REAPER_MODULE),
        env={**backend.service_env(), **reaper_env(backend.spec)},
    )


def start_heartbeat(kv, prefix: str, orphan_timeout: float) -> Heartbeat:
    """Write the time under ``<prefix>heartbeat`` until stopped (each write is a renewal the reaper sees)."""

    def renew() -> bool:
        kv[prefix + HEARTBEAT_KEY] = repr(time.time()).encode()
        return True

    return Heartbeat(renew, orphan_timeout, f"the heartbeat key {prefix}{HEARTBEAT_KEY}", name="yarn-heartbeat").start()
