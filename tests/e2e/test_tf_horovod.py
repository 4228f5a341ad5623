"""The headline: TensorFlow + Horovod (``--variable_update horovod``) through mpilaunch on every backend.

Every test runs ``examples/tf_cnn_benchmark.py`` (tf_cnn_benchmarks' output, TF graph mode through
``tf.compat.v1``, ``horovod.tensorflow``'s DistributedOptimizer and broadcast_global_variables,
synthetic CIFAR-shaped data) with 4 ranks on 2 workers, under the Horovod scripts/build-horovod.sh
built with the TensorFlow pyproject.toml pins (``~/.cache/mpilaunch-horovod/<flavour>/venv``), or,
on Kubernetes, in the project's Horovod image (``scripts/build-image.sh --with-horovod``: the same
TensorFlow, torch and Horovod wheel). ``--verify_replicas`` makes every rank print one
``TFHVD {json}`` line: Horovod's view of the job (rank, size, local and cross rank and size, the
controller), whether the trained variables are identical on every rank (an allgather of their
checksums) and moved from the broadcast initial values, and the rank's images/sec. Each test
checks those against the plan (``--np 4 --slots-per-worker 2``: rank r is local rank r % 2 on
worker r // 2), and that rank 0 printed tf_cnn_benchmarks' ``total images/sec:`` line, which
benchmark teams' scripts read.

With MPILAUNCH_REQUIRE_ALL=1 (scripts/test) a missing build, image or testbed fails the tests.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from support.helpers import REPO, leftover_processes, mpilaunch_env, run_to_end
from support.horovod_builds import MPIRUN, HorovodBuild, assert_horovod_view, horovod_build
from support.ssh_bed import started_ssh_bed
from support.yarn import describe_app

PROGRAM = str(REPO / "examples" / "tf_cnn_benchmark.py")
IMAGE_PROGRAM = "/opt/mpilaunch/examples/tf_cnn_benchmark.py"  # where the project image has it
# Small enough for 4 ranks on this 2-core machine: a few steps of a small ResNet on 32x32 images.
BENCH_ARGS = (
    "--variable_update",
    "horovod",
    "--model",
    "resnet8",
    "--batch_size",
    "8",
    "--num_batches",
    "4",
    "--num_warmup_batches",
    "1",
    "--display_every",
    "2",
    # one thread per op: four ranks share two cores here
    "--num_intra_threads",
    "1",
    "--verify_replicas",
)
JOB = ("--np", "4", "--slots-per-worker", "2")


def tf_ranks(stdout: str) -> list[dict]:
    """The TFHVD lines of a job's output (mpilaunch echoes them as ``[r] TFHVD {...}``)."""
    out = [json.loads(line.split("TFHVD ", 1)[1]) for line in stdout.splitlines() if "TFHVD {" in line]
    return sorted(out, key=lambda r: r["rank"])


def assert_trained(stdout: str, controller: str = "mpi", workers: int = 2, slots: int = 2) -> list[dict]:
    """Horovod's view of every rank is the plan's; the replicas trained in step; the throughput line."""
    ranks = tf_ranks(stdout)
    size = workers * slots
    assert [r["rank"] for r in ranks] == list(range(size)), stdout[-3000:]
    for r in ranks:
        assert_horovod_view(r, workers, slots)
        assert r["controller"] == controller, r
        # the weights are the same on every rank after the steps (broadcast, then averaged gradients),
        # and the steps changed them
        assert (r["identical"], r["moved"]) == (True, True), r
        assert r["images_per_sec"] > 0, r
        assert (r["tf_version"], r["horovod_version"]) == ("2.15.1", "0.28.1"), r
    total = re.findall(r"^(?:\[0\] )?total images/sec: ([0-9.]+)$", stdout, re.M)
    assert len(total) == 1 and float(total[0]) > 0, stdout[-3000:]
    return ranks


def run_local(build: HorovodBuild, name: str, *args, env: dict | None = None, program_args=()):
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--mpirun",
        build.mpirun,
        "--name",
        name,
        *JOB,
        *args,
        "--",
        str(build.dir / "venv" / "bin" / "python"),
        PROGRAM,
        *BENCH_ARGS,
        *program_args,
    ]
    return run_to_end(cmd, 300, cwd=REPO, env=env or mpilaunch_env())


@pytest.fixture(params=["openmpi4", "openmpi5"])
def build(request) -> HorovodBuild:
    return horovod_build(request.param)


@pytest.fixture(scope="session")
def openmpi4_build() -> HorovodBuild:
    return horovod_build("openmpi4")


# ------------------------------------------------------------------ local backend


@pytest.mark.mpi
def test_tf_horovod_local_4_ranks_on_2_workers(build, tmp_path):
    """Open MPI 4.1 and 5 (two workers on one host: the MPI controller's local communicator)."""
    name = f"tfh-local-{build.id}"
    proc = run_local(build, name, "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_trained(proc.stdout)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert leftover_processes(name) == []


@pytest.mark.mpi
def test_tf_horovod_local_gloo_controller(openmpi4_build, tmp_path):
    """Horovod's Gloo controller, mpirun only starting the ranks; rank 0 serves the rendezvous at
    the MASTER_ADDR:MASTER_PORT mpilaunch's rank wrapper chose."""
    name = "tfh-local-gloo"
    proc = run_local(openmpi4_build, name, "--output-dir", str(tmp_path), program_args=("--controller", "gloo"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_trained(proc.stdout, controller="gloo")
    assert leftover_processes(name) == []


@pytest.mark.mpi
def test_tf_horovod_rank_failing_after_init_is_named(openmpi4_build, tmp_path):
    """Rank 2 exits with 47 after hvd.init() and the first step while the others wait in the next
    allreduce: mpilaunch exits with 47, names rank 2 and its worker, and leaves nothing."""
    name = "tfh-fail"
    env = mpilaunch_env() | {"TFHVD_FAIL_RANK": "2", "TFHVD_FAIL_CODE": "47"}
    proc = run_local(
        openmpi4_build, name, "--output-dir", str(tmp_path), "-x", "TFHVD_FAIL_RANK", "-x", "TFHVD_FAIL_CODE", env=env
    )
    assert proc.returncode == 47, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"rank 2 on worker {name}-worker-1 exited with code 47" in proc.stderr, proc.stderr[-3000:]
    assert "rank 2 fails on purpose after the first step" in proc.stderr, proc.stderr[-3000:]
    assert tf_ranks(proc.stdout) == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 47 and report["ranks"][2]["exit_code"] == 47, report["ranks"]
    assert leftover_processes(name) == []


# ------------------------------------------------------------------ ssh backend


@pytest.fixture(scope="module")
def root_bed():
    """Two real sshd hosts (testbeds/ssh) logged into as root, whose Horovod build the ranks run
    (the non-root user the ssh tests log in as cannot reach root's cache)."""
    bed = started_ssh_bed(["tfh-1", "tfh-2"], user="root")
    yield bed
    bed.stop()


@pytest.mark.mpi
@pytest.mark.ssh
def test_tf_horovod_ssh_backend(root_bed, openmpi4_build, tmp_path):
    """Two sshd hosts, each its own network namespace and address: the allreduces cross real TCP."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=2\n" for host in root_bed.hosts))
    name = "tfh-ssh"
    proc = run_local(
        openmpi4_build,
        name,
        "--backend",
        "ssh",
        "--ssh-command",
        root_bed.ssh_command,
        "--hostfile",
        str(hostfile),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = assert_trained(proc.stdout)
    assert [r["worker"] for r in ranks] == ["tfh-1", "tfh-1", "tfh-2", "tfh-2"], ranks
    left = {host: root_bed.leftovers(host) for host in root_bed.hosts}
    assert not any(left.values()), left


# ------------------------------------------------------------------ YARN


@pytest.mark.yarn
@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_tf_horovod_yarn_4_ranks_in_2_containers(openmpi4_build, yarn, tmp_path, launcher):
    name = f"tfh-yarn-{launcher}"
    env = mpilaunch_env(None, **yarn.env) | {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), yarn.env["PATH"]])
    }
    proc = run_local(
        openmpi4_build,
        name,
        "--backend",
        "yarn",
        "--launcher",
        launcher,
        "--memory",
        "2048 MiB",
        "--vcores",
        "1",
        "--output-dir",
        str(tmp_path),
        env=env,
    )
    if proc.returncode != 0:
        pytest.fail(proc.stdout[-3000:] + proc.stderr[-3000:] + describe_app(yarn, name), pytrace=False)
    assert_trained(proc.stdout)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]


# ------------------------------------------------------------------ Kubernetes (real pods)
# horovod_image: tests/e2e/conftest.py's (build-image.sh --with-horovod)


# The tenant's LimitRange gives a container 256Mi by default, and each pod holds two ranks of
# TensorFlow. CPU: the real node has 2 cores, and --pod-cpu 1 left a worker Unschedulable
# (Insufficient cpu) beside the launcher and the reaper.
TENANT_POD_SIZE = ("--pod-cpu", "500m", "--pod-memory", "2Gi")


# Four TensorFlow ranks on the real node's 2 cores, after its pods start: past the suite's 300 s
# default under the load of a run from nothing (both cases were stopped at 300 s there)
@pytest.mark.timeout(600)
@pytest.mark.real_pods
@pytest.mark.parametrize("launcher", ["cluster", "local"])
def test_tf_horovod_on_real_pods(real, horovod_image, tmp_path, launcher):
    """The headline on Kubernetes: the launcher Job, or mpirun here (`--launcher local`)."""
    name = f"tfh-k8s-{launcher}"
    args = [*JOB, "--launcher", launcher, "--output-dir", str(tmp_path), "-q"]
    if launcher == "local":
        args += ["--mpirun", MPIRUN]
    proc = real.run(name, *args, "--", "python3", IMAGE_PROGRAM, *BENCH_ARGS, image=horovod_image, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = assert_trained(proc.stdout)
    assert [r["worker"] for r in ranks] == [f"{name}-worker-{r // 2}" for r in range(4)], ranks
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert real.leftovers(name) == []


@pytest.mark.timeout(600)
@pytest.mark.real_pods
def test_tf_horovod_as_an_edit_only_tenant_in_a_restricted_namespace(tenant, horovod_image, tmp_path):
    """The headline as a tenant: bound only to `edit`, PodSecurity `restricted`, default-deny
    NetworkPolicies, a quota and a LimitRange; the job's own policy lets its pods reach each other."""
    from support.tenant import run_watching

    name = "tfh-tenant"
    code, out, err, seen = run_watching(
        tenant,
        name,
        *JOB,
        *TENANT_POD_SIZE,
        "--output-dir",
        str(tmp_path),
        "-q",
        "--",
        "python3",
        IMAGE_PROGRAM,
        *BENCH_ARGS,
        image=horovod_image,
        timeout=480,
    )
    assert code == 0, out[-3000:] + err[-3000:]
    ranks = assert_trained(out)
    assert [r["worker"] for r in ranks] == [f"{name}-worker-{r // 2}" for r in range(4)], ranks
    for pod in seen.values():
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, pod["spec"]
    assert tenant.leftovers(name) == []
