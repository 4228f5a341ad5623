"""The backend contract (``backends/base.py``) as checks any test can run on a backend object.

``release()`` is idempotent and never raises; ``exec_context()`` after
``wait_ready`` is what the shim (``rsh_agent/shim.py``) needs: a JSON object
naming a transport the shim can load and every host mpirun will be given,
with what that transport reads; a backend's ``capabilities`` say what it
implements, and it implements what they say.
"""

from __future__ import annotations

import json
import socket
import time

from mpilaunch import lifecycle
from mpilaunch.backends.base import BaseBackend
from mpilaunch.rsh_agent import shim

AGENT = "mpilaunch.rsh_agent.transports.agent"
# capability -> the hooks a backend with it overrides (BaseBackend's refuse or do nothing)
CAPABILITY_HOOKS = {
    "detach": ("hand_off",),
    "replace_workers": ("replace_workers",),
    "cluster_launcher": ("run_launcher", "relaunch"),  # remote_mpi_info too where mpirun is not here
    "manage": ("manage_status", "manage_logs", "manage_delete", "manage_wait"),
    "render": ("render",),
}


def ready(backend, timeout: float = 60) -> None:
    backend.allocate()
    backend.wait_ready(time.monotonic() + timeout, lambda ready, total, note=None: None)


def refused(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def assert_release_is_idempotent(backend, settle: float = 0) -> dict:
    """After ``ready``: release twice, nothing raised; the agents' ports are closed after (within
    ``settle`` seconds where the cluster ends the containers after the release returned: YARN's
    NodeManagers kill them once the application has finished). Returns the context."""
    context = backend.exec_context()
    backend.release()
    backend.release()
    if shim._load_transport(context["transport"]).__name__ == AGENT:
        deadline = time.monotonic() + settle
        while not all(refused(w["address"]) for w in context["workers"].values()):
            assert time.monotonic() < deadline, f"an agent still answers after the release: {context['workers']}"
            time.sleep(0.5)
    return context


def assert_exec_context_serves_the_shim(backend, tmp_path) -> None:
    """After ``ready``: the context is JSON, its transport loads, it names every hostfile host."""
    context = backend.exec_context()
    assert json.loads(json.dumps(context)) == context
    assert isinstance(context["transport"], str)
    transport = shim._load_transport(context["transport"])
    assert callable(transport.run)
    # the shim looks each worker up by the host name mpirun got from the hostfile
    assert set(context["workers"]) == set(backend.hostnames().values())
    assert all(isinstance(w, dict) for w in context["workers"].values())
    if transport.__name__ == AGENT:
        with open(context["secret_file"]) as f:
            assert f.read().strip()
        assert all(isinstance(n, str) for n in context.get("forward_env") or ())
        for worker in context["workers"].values():
            host, _, port = worker["address"].rpartition(":")
            assert host and 0 < int(port) < 65536
    path = tmp_path / "context.json"
    lifecycle.write_context(path, backend.plan.job_name, backend)
    assert shim.load_context(str(path)) == {"job": backend.plan.job_name, **backend.exec_context()}


def defined_by(cls, name: str) -> type:
    """The class in ``cls``'s MRO whose body defines ``name`` (classmethods included)."""
    return next(k for k in cls.__mro__ if name in vars(k))


def capability_mismatches(cls) -> list[str]:
    """What a backend class claims and does not implement, or implements and does not claim."""
    wrong = []
    for capability, hooks in CAPABILITY_HOOKS.items():
        claimed = getattr(cls.capabilities, capability)
        overridden = [h for h in hooks if defined_by(cls, h) is not BaseBackend]
        if claimed and len(overridden) != len(hooks):
            wrong.append(f"{cls.__name__} claims {capability} but lacks {sorted(set(hooks) - set(overridden))}")
        if not claimed and overridden:
            wrong.append(f"{cls.__name__} implements {overridden} without claiming {capability}")
    return wrong
