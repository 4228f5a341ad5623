"""A third-party backend joins through an entry point alone: no line of mpilaunch changes.

A package in a temporary directory registers ``toy`` in the entry-point group
``mpilaunch.backends`` (its ``*.dist-info/entry_points.txt``, as pip installs
it). Its options class adds ``--toy-greeting``; its backend is the local
backend's agents under another name. The real command line runs a real job
on it, shows its options in --help, and refuses it --detach by its capabilities.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from support.helpers import REPO, mpilaunch_env

pytestmark = pytest.mark.mpi

OPTIONS = """
from dataclasses import dataclass
from mpilaunch.backends.base import BackendOptions


@dataclass(frozen=True)
class ToyOptions(BackendOptions):
    backend_class = "toy_backend.backend:ToyBackend"
    greeting: str = "hello"

    @classmethod
    def add_arguments(cls, group):
        group.add_argument("--toy-greeting", default="hello", help="what the toy backend says first")

    @classmethod
    def from_args(cls, args):
        return cls(greeting=args.toy_greeting)
"""
BACKEND = """
import sys
from mpilaunch.backends.local.backend import LocalBackend
from toy_backend.options import ToyOptions


class ToyBackend(LocalBackend):
    name = "toy"
    options_class = ToyOptions

    def allocate(self):
        print(f"toy: {self.options.greeting}, {len(self.plan.workers)} workers", file=sys.stderr, flush=True)
        super().allocate()
"""


@pytest.fixture
def toy_env(tmp_path, openmpi5):
    package = tmp_path / "toy_backend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "options.py").write_text(textwrap.dedent(OPTIONS))
    (package / "backend.py").write_text(textwrap.dedent(BACKEND))
    dist = tmp_path / "toy_backend-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mpilaunch.backends]\ntoy = toy_backend.options:ToyOptions\n")
    return mpilaunch_env(openmpi5, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))


def mpilaunch(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_an_installed_backend_runs_a_job_with_its_own_option(toy_env):
    ran = mpilaunch(
        toy_env,
        "--backend",
        "toy",
        "--toy-greeting",
        "ahoy",
        "--np",
        "2",
        "--slots-per-worker",
        "1",
        "--",
        sys.executable,
        "-c",
        "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'])",
    )
    assert ran.returncode == 0, ran.stderr
    assert "toy: ahoy, 2 workers" in ran.stderr
    assert {line.split("rank ")[-1] for line in ran.stdout.splitlines() if "rank " in line} == {"0", "1"}


def test_help_lists_the_installed_backend_and_its_options(toy_env):
    shown = mpilaunch(toy_env, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "--backend toy:" in shown.stdout and "--toy-greeting" in shown.stdout
    assert "local, k8s, yarn, ssh, toy" in shown.stdout


def test_its_capabilities_decide_what_it_may_do(toy_env):
    refused = mpilaunch(toy_env, "--backend", "toy", "--detach", "--np", "2", "--", "true")
    assert refused.returncode == 2
    assert refused.stderr.startswith("mpilaunch: error: --detach needs a cluster backend: toy workers")
