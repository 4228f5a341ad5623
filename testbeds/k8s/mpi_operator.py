"""Kubeflow's mpi-operator on the real-node testbed: the peer mpilaunch is measured against.

Runs the operator's controller (v0.8.2, built from the Go module source by
``build-mpi-operator.sh``) as a process next to the control plane, the way the
testbed runs kube-controller-manager: a kubeconfig of its own (a client
certificate for the user ``mpi-operator``, bound to the operator's own
ClusterRole from its manifests), not an in-cluster Deployment, so it starts
without an image. Its MPIJob CRD comes from the same module source. MPIJobs
run in ``foreign-mpiop`` (``build-foreign-images.sh mpiop``): Debian's Open MPI
4.1 with sshd for ``mpiuser`` on port 2222, as the operator's own examples
build theirs, and tests/programs/placement.py at /home/mpiuser/placement.py.

    python -m testbeds.k8s.mpi_operator build          # binary, CRD, image archives
    python -m testbeds.k8s.mpi_operator up [--workdir DIR]   # on a running `cluster up --real-node`
    python -m testbeds.k8s.mpi_operator down [--workdir DIR]

    from testbeds.k8s.mpi_operator import MpiOperator, mpijob
    op = MpiOperator(cluster).start()        # stopped by cluster.stop() too
    cluster.apply(mpijob("pi", image, workers=2, slots=2, command=[...]))

Notes: the operator always runs leader election (a Lease in the namespace
``mpi-operator``) and serves its health check on the fixed port 8080 of every
address, so one testbed at a time runs it (the real node is one at a time
anyway). Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .common import ClusterError, cache_dir

if TYPE_CHECKING:  # an annotation only: the caller makes the cluster
    from .cluster import KubeCluster

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build-mpi-operator.sh"
VERSION = os.environ.get("MPI_OPERATOR_VERSION", "v0.8.2")
COMPONENT = "mpi-operator"
USER = "mpi-operator"
LOCK_NAMESPACE = "mpi-operator"
CRD = "mpijobs.kubeflow.org"
#: the worker image's user, sshd config and rank program (mpiop-image-hook.sh)
UID = 1000
HOME = "/home/mpiuser"
PROGRAM = f"{HOME}/placement.py"
SSHD = ["/usr/sbin/sshd", "-De", "-f", f"{HOME}/.sshd_config"]


def bin_path() -> Path:
    return cache_dir() / "bin" / f"mpi-operator-{VERSION}"


def share_dir() -> Path:
    return cache_dir() / "share" / f"mpi-operator-{VERSION}"


def built() -> bool:
    return os.access(bin_path(), os.X_OK) and (share_dir() / "kubeflow.org_mpijobs.yaml").exists()


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) the controller and copy its CRD; the binary's path.
    Cold: ~10 min of CPU on 2 cores (client-go 0.35 is in no other graph here)."""
    if not built():
        if not quiet:
            print(f"[mpi-operator] building {VERSION} via {BUILD_SH}", file=sys.stderr)
        env = {**os.environ, "MPI_OPERATOR_VERSION": VERSION}
        subprocess.run(["bash", str(BUILD_SH)], check=True, env=env, stdout=subprocess.DEVNULL if quiet else None)
    return bin_path()


def operator_binding() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "mpi-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "mpi-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }


class MpiOperator:
    """The mpi-operator controller process for one running KubeCluster."""

    def __init__(self, cluster: KubeCluster, verbosity: int = 2):
        self.cluster = cluster
        self.verbosity = verbosity
        self.start_seconds: float | None = None

    def start(self, timeout: float = 120.0) -> "MpiOperator":
        t0 = time.monotonic()
        binary = ensure_built()
        c = self.cluster
        self.install_crd(timeout)
        c.kubectl("apply", "-f", str(share_dir() / "cluster-role.yaml"))
        c.apply(
            [
                operator_binding(),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LOCK_NAMESPACE}},
            ]
        )
        kc = c.client_kubeconfig(c.workdir / "mpi-operator.kubeconfig", USER)
        self.stop()  # a second start replaces the first: two would fight over port 8080 and the Lease
        log = c.workdir / "logs" / f"{COMPONENT}.log"
        self._log_from = log.stat().st_size if log.exists() else 0
        try:
            # the Deployment's flags (-alsologtostderr) and the defaults a user gets
            # (threadiness 2, 5 QPS / burst 10 to the API server)
            c.spawn(
                COMPONENT,
                [binary, f"--kubeConfig={kc}", f"--lock-namespace={LOCK_NAMESPACE}", f"-v={self.verbosity}"],
            )
            c.wait(self.leading, timeout - (time.monotonic() - t0), "mpi-operator holds its leader Lease", interval=0.3)
        except ClusterError as e:
            self.stop()
            raise ClusterError(f"{e}\nmpi-operator log:\n{c.log_tail(COMPONENT)}") from None
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def install_crd(self, timeout: float = 60.0) -> None:
        """What an admin does once: the MPIJob CRD (server-side: it is over the annotation limit)."""
        c = self.cluster
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(share_dir() / "kubeflow.org_mpijobs.yaml"))
        c.wait_crds_established([CRD], timeout)

    def leading(self) -> bool:
        """This process took the leader Lease (its own log says so: a Lease holder alone could be
        an earlier process, still renewing it)."""
        proc = self.cluster._procs.get(COMPONENT)
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"mpi-operator exited with {proc.returncode}")
        with open(self.cluster.workdir / "logs" / f"{COMPONENT}.log", "rb") as f:
            f.seek(self._log_from)
            return b"successfully acquired lease" in f.read().lower()

    def stop(self) -> None:
        """Kill the controller, and any other of this testbed's (an attached ``up`` started
        it): KubeCluster.stop() would get them too, by their marker. The CRD, MPIJobs and
        their pods stay."""
        from .binaries import kill_all, marked_pids

        c = self.cluster
        c.kill_component(COMPONENT)
        for pid in marked_pids(c.marker):
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if Path(os.fsdecode(argv0)).name.startswith("mpi-operator-"):
                kill_all([pid], None, timeout=10.0)


# -------------------------------------------------------------- manifests


def _pod_template(image: str, name: str, command: list[str], placement: dict, extra: dict | None) -> dict:
    container = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "securityContext": {"runAsUser": UID},
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    }
    spec = {"containers": [container], "terminationGracePeriodSeconds": 5, **placement}
    for key, value in (extra or {}).items():  # e.g. a restricted namespace's securityContext, resources
        if key == "container":
            container.update(value)
        else:
            spec[key] = value
    return {"spec": spec}


def mpijob(
    name: str,
    image: str,
    workers: int,
    slots: int,
    command: list[str],
    namespace: str = "default",
    placement: dict | None = None,
    extra: dict | None = None,
    mpirun_args: tuple = (),
) -> dict:
    """A kubeflow.org/v2beta1 MPIJob as the operator's examples write one (v2beta1/pi): a
    launcher running ``mpirun`` (through the image's ``wait-hosts``, as their entrypoint
    waits for the workers' DNS names) and ``workers`` pods running sshd as mpiuser.
    ``placement``: pod-spec fields that put the pods on the node (nodeSelector,
    tolerations); ``extra``: more pod-spec fields, ``container`` for the container's;
    ``mpirun_args``: more of mpirun's options, before the program."""
    placement = placement or {}
    mpirun = ["wait-hosts", "mpirun", "-n", str(workers * slots), *mpirun_args, *command]
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "slotsPerWorker": slots,
            # Running: the workers go when the launcher ends, as mpilaunch releases its own
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
            "sshAuthMountPath": f"{HOME}/.ssh",
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    # one try, as mpilaunch makes, and a failed launcher's pod and log stay
                    "restartPolicy": "Never",
                    "template": _pod_template(image, "mpi-launcher", mpirun, placement, extra),
                },
                "Worker": {
                    "replicas": workers,
                    "template": _pod_template(image, "mpi-worker", SSHD, placement, extra),
                },
            },
        },
    }


def real_node_placement() -> dict:
    from .node_config import REAL_KEY

    return {
        "nodeSelector": {REAL_KEY: "true"},
        "tolerations": [{"key": REAL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }


def job_pods(cluster: KubeCluster, name: str, role: str | None = None, namespace: str = "default") -> list[dict]:
    """The MPIJob's pods (``role``: launcher or worker only)."""
    selector = f"training.kubeflow.org/job-name={name}" + (f",training.kubeflow.org/job-role={role}" if role else "")
    return cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]


def job_state(cluster: KubeCluster, name: str, namespace: str = "default") -> str | None:
    """The MPIJob's last true condition (Created, Running, Succeeded, Failed), or None."""
    p = cluster.kubectl("get", "mpijob", name, "-n", namespace, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    conds = [x for x in json.loads(p.stdout).get("status", {}).get("conditions", []) if x.get("status") == "True"]
    return conds[-1]["type"] if conds else None


# -------------------------------------------------------------- CLI


def main(argv=None) -> int:
    from .cluster import DEFAULT_WORKDIR, KubeCluster

    ap = argparse.ArgumentParser(prog="python -m testbeds.k8s.mpi_operator", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "up", "down"):
        p = sub.add_parser(name)
        p.add_argument("--workdir", default=str(DEFAULT_WORKDIR))
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(ensure_built())
        for name in ("mpiop", "mpiop5"):
            subprocess.run(["bash", str(HERE / "build-foreign-images.sh"), name], check=True)
        return 0
    c = KubeCluster.attach(args.workdir)
    if args.cmd == "down":
        MpiOperator(c).stop()
        c.pids.pop(COMPONENT, None)
        c._write_state()
        print("mpi-operator stopped", file=sys.stderr)
        return 0
    if c.node is None:
        print(f"the cluster in {args.workdir} has no real node (cluster up --real-node)", file=sys.stderr)
        return 1
    op = MpiOperator(c).start()
    image = c.node.foreign_image("mpiop")
    c._write_state()
    c.detach()
    print(f"# mpi-operator {VERSION} up in {op.start_seconds:.1f}s; worker image {image}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
