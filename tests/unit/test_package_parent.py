"""Children that must import this same mpilaunch (a checkout, or the job's tools zip in a launcher
pod) get its package's parent on PYTHONPATH, wherever the module that starts them sits in the package.

A Python that knows nothing of mpilaunch (Debian's /usr/bin/python3, as in an image without it) must
find the module from that path alone: the k8s exec relay broke exactly so when it moved a folder down.
"""

import os
import subprocess
import sys

import pytest

from mpilaunch.core.pylauncher import PACKAGE_PARENT
from support.helpers import REPO

SYSTEM_PYTHON = "/usr/bin/python3"


def test_the_package_parent_is_the_directory_holding_mpilaunch():
    assert os.path.realpath(PACKAGE_PARENT) == os.path.realpath(REPO)


@pytest.mark.parametrize(
    "module",
    [
        "mpilaunch.backends.k8s.exec_path.relay",
        "mpilaunch.backends.yarn.in_cluster.container",
        "mpilaunch.backends.k8s.in_cluster.launcher",
        "mpilaunch.rank",
    ],
)
def test_a_python_without_mpilaunch_finds_the_module_from_the_package_parent(module, tmp_path):
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("no system python3")
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    ran = subprocess.run(
        [SYSTEM_PYTHON, "-s", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": PACKAGE_PARENT},
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr


def test_the_relay_and_the_yarn_containers_are_handed_that_path(tmp_path, monkeypatch):
    pytest.importorskip("skein")
    from mpilaunch.backends.yarn.backend import YarnBackend
    from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan

    spec = JobSpec(command=("true",), backend="yarn", name="pp", np=1)
    backend = YarnBackend(spec, Plan("pp", (WorkerPlan("pp-worker-0", 1, 0),)), tmp_path)
    assert backend.service_env()["PYTHONPATH"].split(os.pathsep)[0] == PACKAGE_PARENT

    from mpilaunch.backends.k8s.exec_path import relay

    seen = {}

    class Refuse(Exception):
        pass

    def popen(argv, env, **kw):
        seen.update(argv=argv, env=env)
        raise Refuse

    monkeypatch.setattr("subprocess.Popen", popen)  # relay.start imports subprocess when it runs
    with pytest.raises(Refuse):
        relay.start({"transport": "x", "workers": {}}, tmp_path, python=sys.executable)
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[0] == PACKAGE_PARENT
    assert seen["argv"][1:3] == ["-m", "mpilaunch.backends.k8s.exec_path.relay"]
