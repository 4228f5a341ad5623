"""The backend contract (``backends/base.py``) for every backend that runs without a cluster, and the fake.

``release()`` is idempotent and never raises: before ``allocate``, and twice
after it; after it the workers are gone. ``exec_context()`` after
``wait_ready`` is what the shim (``rsh_agent/shim.py``) needs: a JSON object
naming a transport the shim can load and every host mpirun will be given,
with what that transport reads (``support/backend_contract.py``). Backends
come from the registry (``mpilaunch.backends``) by name; those whose workers
live elsewhere (k8s, yarn, ssh) are checked the same way against their
testbeds in ``tests/e2e/<name>/test_<name>_backend_contract.py``. Every registered
backend's capabilities and registry line are checked here, and so is the
contract's shape: a required surface of about ten methods, small optional
protocols (``backends/protocols.py``) implemented in full by whoever claims them.
"""

from __future__ import annotations

import importlib
import re

import pytest

from mpilaunch import backends
from mpilaunch.backends import base, protocols
from mpilaunch.core.spec import JobSpec
from support.backend_contract import (
    assert_exec_context_serves_the_shim,
    assert_release_is_idempotent,
    capability_mismatches,
    defined_by,
    ready,
    unimplemented,
)
from support.fake_backend import FakeBackend, FakeClusterBackend

# the backends an in-cluster launcher runs the lifecycle with (not in the registry)
LAUNCHER_BACKENDS = (
    "mpilaunch.backends.k8s.in_cluster.launcher:ReadyPods",
    "mpilaunch.backends.yarn.in_cluster.launcher:PublishedContainers",
)


def backend_params() -> list:
    """Every registered backend whose workers run on this machine (the registry says which), and the fake."""
    params = []
    for name in backends.names():
        try:
            cls = backends.load(name)
        except Exception as e:  # UsageError: its extra is not installed
            params.append(pytest.param(None, id=name, marks=pytest.mark.skip(reason=f"not loadable here: {e}")))
            continue
        if cls.workers_on_this_host:
            params.append(pytest.param(cls, id=name))
        else:
            params.append(
                pytest.param(
                    cls,
                    id=name,
                    marks=pytest.mark.skip(
                        reason="its workers live on a cluster or other hosts: tests/e2e/<name>/test_<name>_backend_contract.py"
                    ),
                )
            )
    return params + [pytest.param(FakeBackend, id="fake"), pytest.param(FakeClusterBackend, id="fake-cluster")]


@pytest.fixture(params=backend_params())
def backend(request, tmp_path, make_plan):
    """A backend of the job ``job`` (4 ranks on 2 workers), released whatever the test did."""
    cls = request.param
    spec = JobSpec(command=("true",), np=4, name="job", backend="local" if issubclass(cls, FakeBackend) else cls.name)
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    made = cls(spec, make_plan(), rundir)
    yield made
    made.release()


def test_release_before_allocate_does_not_raise(backend):
    backend.release()
    backend.release()


def test_release_twice_after_allocate_does_not_raise_and_frees_the_workers(backend):
    ready(backend)
    assert_release_is_idempotent(backend)


def test_exec_context_after_wait_ready_is_what_the_shim_needs(backend, tmp_path):
    ready(backend)
    assert_exec_context_serves_the_shim(backend, tmp_path)


@pytest.mark.parametrize("name", backends.names())
def test_capabilities_say_what_the_backend_implements(name):
    """Capabilities are data the CLI, manage and the lifecycle trust: a backend must implement
    each hook its capabilities promise, and claim what it implements."""
    try:
        cls = backends.load(name)
    except Exception as e:
        pytest.skip(f"not loadable here: {e}")
    assert capability_mismatches(cls) == []


@pytest.mark.parametrize("name", backends.names())
def test_the_registry_line_leads_to_the_backend_and_back(name):
    """One registry line names the options class; it names the backend class, which names it back
    (spec.backend_options is always an instance of the backend's own options class)."""
    from mpilaunch.backends.base import BackendOptions

    options = backends.options_class(name)
    assert issubclass(options, BackendOptions) and options.backend_class
    try:
        cls = backends.load(name)
    except Exception as e:
        pytest.skip(f"not loadable here: {e}")
    assert cls.name == name and cls.options_class is options


def every_backend_class() -> list:
    """Every backend class: the registry's, the in-cluster launchers' and the fakes."""
    params = []
    for name in backends.names():
        params.append(pytest.param(lambda name=name: backends.load(name), id=name))
    for path in LAUNCHER_BACKENDS:
        module, _, attr = path.partition(":")
        params.append(pytest.param(lambda m=module, a=attr: getattr(importlib.import_module(m), a), id=attr))
    return params + [
        pytest.param(lambda: FakeBackend, id="fake"),
        pytest.param(lambda: FakeClusterBackend, id="fake-cluster"),
    ]


@pytest.mark.parametrize("load", every_backend_class())
def test_each_optional_protocol_is_implemented_in_full_by_who_claims_it(load):
    try:
        cls = load()
    except Exception as e:  # its extra is not installed
        pytest.skip(f"not loadable here: {e}")
    assert capability_mismatches(cls) == []
    assert not getattr(cls, "__abstractmethods__", None), f"{cls.__name__} leaves {cls.__abstractmethods__} abstract"


def test_the_required_surface_is_about_ten_methods_all_in_base():
    """What every backend implements (or inherits) is BaseBackend's public methods, named in
    base.REQUIRED; a hook added to BaseBackend without growing REQUIRED fails here, and so does
    a REQUIRED past eleven (ten, and control_address, which came from the RemoteHosts protocol
    when the optional protocols went down to three: issue 50)."""
    public = {
        name
        for name, value in vars(base.BaseBackend).items()
        if not name.startswith("_") and isinstance(value, (classmethod, staticmethod, type(lambda: 0)))
    }
    assert public == set(base.REQUIRED)
    assert len(base.REQUIRED) <= 11
    assert base.BaseBackend.__abstractmethods__ == {"allocate", "wait_ready", "exec_context", "release"}


def test_the_optional_protocols_are_at_most_three():
    """Each serves capabilities a user asks for (``protocols.SERVED_BY``); what every backend has an
    answer to, if only "none", is a default in base or a collaborator (``cluster_notes``)."""
    assert len(protocols.PROTOCOLS) <= 3
    assert set(protocols.SERVED_BY.values()) == set(protocols.PROTOCOLS)


@pytest.mark.parametrize("protocol", protocols.PROTOCOLS, ids=lambda p: p.__name__)
def test_an_optional_protocol_is_small_apart_and_shown_by_one_backend(protocol):
    """A protocol adds a few methods, none of the required surface's, and its docstring names the
    backend that shows it (``backends/<name>/backend.py``), which implements it in full."""
    members = protocols.members(protocol)
    assert 1 <= len(members) <= 5
    assert not set(members) & set(base.REQUIRED)
    assert not any(
        set(members) & set(protocols.members(other)) for other in protocols.PROTOCOLS if other is not protocol
    )
    shown = re.findall(r"``backends/(\w+)/backend\.py``", protocol.__doc__ or "")
    assert len(shown) == 1, f"{protocol.__name__}'s docstring names no example backend (or several)"
    try:
        cls = backends.load(shown[0])
    except Exception as e:
        pytest.skip(f"not loadable here: {e}")
    assert issubclass(cls, protocol) and unimplemented(cls, protocol) == []


def test_the_fake_implements_exactly_the_required_surface():
    """The lifecycle tests run on it (every job without --retries or a launcher in the cluster:
    tests/lifecycle/conftest.py), so the lifecycle needs nothing of a backend beyond base.REQUIRED."""
    hooks = set(base.REQUIRED).union(*(protocols.members(p) for p in protocols.PROTOCOLS))
    assert not any(issubclass(FakeBackend, p) for p in protocols.PROTOCOLS)
    defined = {name for name in hooks if defined_by(FakeBackend, name) is FakeBackend}
    assert defined <= set(base.REQUIRED)
    assert {"allocate", "wait_ready", "exec_context", "release"} <= defined
