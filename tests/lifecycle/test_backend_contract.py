"""The backend contract (``backends/base.py``) for every backend that runs without a cluster, and the fake.

``release()`` is idempotent and never raises: before ``allocate``, and twice
after it; after it the workers are gone. ``exec_context()`` after
``wait_ready`` is what the shim (``rsh_agent/shim.py``) needs: a JSON object
naming a transport the shim can load and every host mpirun will be given,
with what that transport reads (``support/backend_contract.py``). Backends
come from the registry (``mpilaunch.backends``) by name; those whose workers
live elsewhere (k8s, yarn, ssh) are checked the same way against their
testbeds in ``tests/e2e/<name>/test_<name>_backend_contract.py``. Every registered
backend's capabilities and registry line are checked here.
"""

from __future__ import annotations

import pytest

from mpilaunch import backends
from mpilaunch.spec import JobSpec
from support.backend_contract import (assert_exec_context_serves_the_shim, assert_release_is_idempotent,
                                      capability_mismatches, ready)
from support.fake_backend import FakeBackend


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
            params.append(pytest.param(cls, id=name, marks=pytest.mark.skip(
                reason="its workers live on a cluster or other hosts: tests/e2e/<name>/test_<name>_backend_contract.py")))
    return params + [pytest.param(FakeBackend, id="fake")]


@pytest.fixture(params=backend_params())
def backend(request, tmp_path, make_plan):
    """A backend of the job ``job`` (4 ranks on 2 workers), released whatever the test did."""
    cls = request.param
    spec = JobSpec(command=("true",), np=4, name="job", backend="local" if cls is FakeBackend else cls.name)
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
