"""Fixtures of the end-to-end tests: the cluster testbeds (testbeds/k8s, testbeds/yarn).

Here, not in a test module: a fixture imported into another test module is a
second fixture there, and each started its own testbed. Session-scoped: every
module under tests/e2e shares one testbed of each kind. Their helpers are
``support/k8s.py``, ``support/real_pods.py`` and ``support/yarn.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

from support.helpers import mpilaunch_env
from support.mpi_installs import require
from support.real_pods import Real

# ------------------------------------------------------------------ cluster testbeds (kwok nodes, YARN)


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
    if shared:  # started elsewhere (cluster up): its helpers work; add_volcano/add_kueue too
        yield KubeCluster.attach(shared)
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
    # kwok runs the pods' commands on this machine, where mpilaunch is: no tools image (backends/k8s/tools.py)
    env = mpilaunch_env(
        openmpi5, KUBECONFIG=str(kube.kubeconfig), MPILAUNCH_K8S_PYTHON=sys.executable, MPILAUNCH_K8S_TOOLS="image"
    )
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
    return {
        "env": mpilaunch_env(openmpi5, **yarn.env)
        | {"PATH": os.pathsep.join([os.path.dirname(sys.executable), yarn.env["PATH"]])},
        "mpirun": openmpi5.mpirun,
    }


@pytest.fixture
def intel_env(intel, yarn):
    """Intel MPI (impi-rt) and its mpi4py; nothing Intel-specific is passed to the job."""
    return {
        "env": mpilaunch_env(intel, **yarn.env)
        | {"PATH": os.pathsep.join([os.path.dirname(sys.executable), yarn.env["PATH"]])},
        "mpirun": intel.mpirun,
    }


# ------------------------------------------------------------------ the real node (tests/e2e/k8s/test_real_pods.py,
# test_foreign_image.py, tests/e2e/test_horovod.py): one testbed for every module


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
def foreign(real):
    """name -> the tag of that foreign image, built (cached) and imported into the node's containerd."""
    tags = {}

    def image(name: str) -> str:
        if name not in tags:
            try:
                tags[name] = real.cluster.node.foreign_image(name)
            except Exception as e:  # the build's own error names the cause
                require(f"foreign image {name} did not build: {e}")
        return tags[name]

    return image


@pytest.fixture(scope="session")
def tenant(real, tmp_path_factory):
    """A namespace of a locked-down shared cluster and its 'edit'-only user (support/tenant.py)."""
    from support.tenant import Tenant

    t = Tenant(real, tmp_path_factory.mktemp("tenant")).setup()
    yield t
    t.teardown()


@pytest.fixture(autouse=True)
def real_node_alive(request):
    """A test on the real node fails at once, saying why, when a process of the testbed died (a
    kubelet that panicked made every later test wait out its timeouts instead)."""
    if "real" in request.fixturenames:
        from testbeds.k8s.cluster import ClusterError

        try:
            request.getfixturevalue("real").cluster.check_alive()
        except ClusterError as e:
            pytest.fail(f"the real-node testbed is broken: {e}", pytrace=False)


@pytest.fixture(scope="session")
def tf_image(real):
    """The image with TensorFlow for PS mode: the testbed's one TensorFlow variant,
    ``build-image.sh --with-horovod`` (the `ps` extra, Debian's torch and Horovod, each
    in a cached layer of its own, so a code change rebuilds only the code)."""
    try:
        return real.cluster.node.project_image(with_tf=True)
    except Exception as e:  # the build's own error names the cause
        require(f"the TensorFlow image did not build: {e}")


@pytest.fixture(scope="session")
def horovod_image(real):
    """The project's image with TensorFlow, PyTorch and Horovod (``build-image.sh
    --with-horovod``, the same image as ``tf_image``): mpilaunch and Horovod both in it."""
    try:
        return real.cluster.node.project_image(with_horovod=True)
    except Exception as e:  # the build's own error names the cause
        require(f"the Horovod image did not build: {e}")
