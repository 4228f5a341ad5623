"""The YARN launcher container, from the submitting side: what it is given, and a new one per attempt.

With ``--launcher cluster`` mpirun runs in a container of the skein service
``launcher`` (:mod:`mpilaunch.backends.yarn.in_cluster.launcher`). ``put_launch`` hands it the
launch description and the job secret through skein's key-value store once
every worker's agent answers.

``--retries``: the launcher container ends once it has put mpirun's exit
code, so each further attempt gets a new one in the same application
(``relaunch``): the old one's keys go first (a new launcher must not read
the last attempt's description or exit code), then skein's
ApplicationMaster adds one container to the launcher service. The
lifecycle's ``wait_ready`` waits for it to run, and ``run_launcher`` puts
the new description, with the replaced workers' addresses and the attempt
number the ranks see as ``MPILAUNCH_ATTEMPT``.
"""

from __future__ import annotations

import json
import os
import time

import skein

from ..launch_description import LaunchDescription, LaunchWorker, carried_spec
from .client import state_name
from .keys import (
    EXIT_KEY,
    FORWARD_ENV,
    INFO_KEY,
    KV_PREFIX,
    LAUNCHER_SECRET_KEY,
    LAUNCHER_SERVICE,
    OUT_KEY,
    SPEC_KEY,
    STOP_KEY,
)
from .report import ENDED

# How long a relaunch waits for the last attempt's launcher container to end after killing it.
RETIRE_WAIT_S = 10.0


def launch_description(backend) -> LaunchDescription:
    """What the launcher container needs to run mpirun as the local launcher would."""
    from ...core import mpi

    spec = backend.spec
    archive = bool(backend.opts.env_archive)
    environ = dict(os.environ)
    names = mpi.forwarded_names(environ, spec.env)
    values = mpi.resolve_env(names, spec.env, environ)  # -x NAME takes its value here
    mpirun = spec.mpirun
    if mpirun is None and not archive:
        # The same MPI as here (the containers run this machine's Python too).
        try:
            mpirun = mpi.find_mpirun(spec.mpi, None, environ.get("PATH")).path
        except Exception:
            mpirun = None
    return LaunchDescription(
        job=backend.plan.job_name,
        workers=tuple(LaunchWorker(w.name, w.slots, backend.addresses[w.name]) for w in backend.plan.workers),
        rank_prefix=tuple(backend.rank_prefix()),
        # detached: the launcher enforces --timeout and ends the application itself; attached, this side does
        spec=carried_spec(spec),
        mpirun=mpirun,
        env=tuple(f"{n}={values[n]}" for n in names if n in values),
        attempt=backend.attempt,
        status_token=backend.status_token,
        # mpirun's working directory (ranks start there where it exists),
        # as with the local launcher; the container's own where it does not.
        cwd=os.getcwd(),
        # --retries with --spares: the launcher container swaps a spare in itself (spare_swaps.py)
        relaunches=spec.retries if spec.spares else 0,
        cluster={
            # --spares: the spare container serving a worker (its address is the worker's above)
            "serving": dict(backend.spares.serving),
            "spares": bool(spec.spares),
            "forward_env": list(backend.exec_context()["forward_env"]),
            "environ": {} if archive else {k: environ[k] for k in FORWARD_ENV if k in environ},
        },
    )


def put_launch(backend) -> None:
    """The launch description and the secret, for the launcher container (which deletes the secret)."""
    from ...rsh_agent.agent_client import read_secret

    backend.app.kv[KV_PREFIX + SPEC_KEY] = json.dumps(launch_description(backend).to_dict()).encode()
    backend.app.kv[KV_PREFIX + LAUNCHER_SECRET_KEY] = read_secret(str(backend.secret_file))


def wait_ended(app, container_id: str, timeout: float) -> bool:
    """Whether the launcher container ``container_id`` ended within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            containers = app.get_containers(services=[LAUNCHER_SERVICE], states=list(skein.model.ContainerState))
        except skein.exceptions.SkeinError:
            return False
        if all(c.id != container_id or state_name(c.state) in ENDED for c in containers):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def relaunch(backend, attempt: int) -> None:
    """A new launcher container for attempt ``attempt``; the last attempt's is retired."""
    if not backend.launcher_in_cluster:
        return

    backend.refresh_launcher()
    old = backend.launcher_container
    if old.get("id"):
        if old.get("state") not in ENDED:
            try:
                backend.app.kill_container(old["id"])
            except skein.exceptions.SkeinError:
                pass  # it ended meanwhile
            # a chunk of output it puts after the keys below are cleared would read as the new
            # attempt's first chunk (and hide the new launcher's chunks of the same numbers)
            wait_ended(backend.app, old["id"], RETIRE_WAIT_S)
        backend.retired_launchers.add(old["id"])
    kv = backend.app.kv
    for key in (SPEC_KEY, LAUNCHER_SECRET_KEY, EXIT_KEY, INFO_KEY, STOP_KEY):
        kv.discard(KV_PREFIX + key)
    kv.discard_prefix(KV_PREFIX + OUT_KEY)
    backend.out_last = ""
    backend.launcher_info, backend.launcher_container = {}, {}
    backend.attempt = attempt
    backend.app.add_container(LAUNCHER_SERVICE)
