"""The backend contract (``backends/base.py``) as checks any test can run on a backend object.

``release()`` is idempotent and never raises; ``exec_context()`` after
``wait_ready`` is what the shim (``rsh_agent/shim.py``) needs: a JSON object
naming a transport the shim can load and every host mpirun will be given,
with what that transport reads; a backend's ``capabilities`` say which
optional protocols (``backends/protocols.py``) it implements, and it
implements each of them in full.
"""

from __future__ import annotations

import json
import socket
import time

from mpilaunch.backends import protocols
from mpilaunch.backends.base import hostnames
from mpilaunch.backends.named_job import NamedJob
from mpilaunch.job import lifecycle
from mpilaunch.rsh_agent import shim
from mpilaunch.wire import protocol as P

AGENT = "mpilaunch.rsh_agent.transports.agent"


def ready(backend, timeout: float = 60) -> None:
    backend.allocate()
    backend.wait_ready(time.monotonic() + timeout, lambda ready, total, note=None: None)


def refused(address: str) -> bool:
    unix = P.unix_sockaddr(address)  # the local backend's agents: a Unix socket (issue 49)
    try:
        if unix is not None:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(2)
                sock.connect(unix)
        else:
            host, _, port = address.rpartition(":")
            socket.create_connection((host, int(port)), timeout=2).close()
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    return False


def assert_release_is_idempotent(backend, settle: float = 0) -> dict:
    """After ``ready``: release twice, nothing raised; the agents' ports are closed after (within
    ``settle`` seconds where the cluster ends the containers after the release returned: YARN's
    NodeManagers kill them once the application has finished). Returns the context."""
    context = backend.exec_context()
    backend.release()
    backend.release()
    if shim.load_transport(context["transport"]).__name__ == AGENT:
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
    transport = shim.load_transport(context["transport"])
    assert callable(transport.run)
    # the shim looks each worker up by the host name mpirun got from the hostfile
    assert set(context["workers"]) == set(hostnames(backend.plan).values())
    assert all(isinstance(w, dict) for w in context["workers"].values())
    if transport.__name__ == AGENT:
        with open(context["secret_file"]) as f:
            assert f.read().strip()
        assert all(isinstance(n, str) for n in context.get("forward_env") or ())
        for worker in context["workers"].values():
            if P.unix_sockaddr(worker["address"]) is not None:
                continue  # a Unix socket's path (the local backend)
            host, _, port = worker["address"].rpartition(":")
            assert host and 0 < int(port) < 65536
    path = tmp_path / "context.json"
    lifecycle.write_context(path, backend.plan.job_name, backend)
    written = shim.load_context(str(path))
    # and what `mpilaunch stacks` finds the job by: its backend, the python its probe runs with
    assert written == {
        "job": backend.plan.job_name,
        "backend": backend.name,
        **backend.exec_context(),
        "probe_python": written["probe_python"],
    }


def defined_by(cls, name: str) -> type | None:
    """The class in ``cls``'s MRO whose body defines ``name`` (classmethods included); None: none does."""
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def unimplemented(cls, protocol: type) -> list[str]:
    """The methods of ``protocol`` that ``cls`` leaves abstract (the protocol's own declarations)."""
    return [
        name
        for name in protocols.members(protocol)
        if defined_by(cls, name) in (None, protocol) or getattr(getattr(cls, name), "__isabstractmethod__", False)
    ]


def capability_mismatches(cls) -> list[str]:
    """What a backend class claims and does not implement, or implements and does not claim: each
    capability comes with its protocol (``protocols.SERVED_BY``), implemented in full."""
    wrong = []
    for capability, protocol in protocols.SERVED_BY.items():
        claimed, opted_in = getattr(cls.capabilities, capability), issubclass(cls, protocol)
        if claimed and not opted_in:
            wrong.append(f"{cls.__name__} claims {capability} but is no {protocol.__name__}")
        if opted_in and not claimed:
            wrong.append(f"{cls.__name__} is a {protocol.__name__} without claiming {capability}")
    if cls.capabilities.spares and not issubclass(cls, protocols.ReplacesWorkers):
        wrong.append(f"{cls.__name__} claims spares but is no ReplacesWorkers (which takes them)")
    if cls.capabilities.spares and cls.spares_waiting is protocols.ReplacesWorkers.spares_waiting:
        wrong.append(f"{cls.__name__} claims spares but never says how many wait (spares_waiting)")
    for protocol in protocols.PROTOCOLS:
        if issubclass(cls, protocol) and unimplemented(cls, protocol):
            wrong.append(f"{cls.__name__} is a {protocol.__name__} but lacks {unimplemented(cls, protocol)}")
    if issubclass(cls, protocols.JobsByName):
        named = cls.named_job
        if not (isinstance(named, type) and issubclass(named, NamedJob)) or named.__abstractmethods__:
            wrong.append(f"{cls.__name__} is a JobsByName whose named_job is no complete NamedJob: {named!r}")
    return wrong
