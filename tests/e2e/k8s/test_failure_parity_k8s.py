"""The same failure, reported the same way in mpirun mode and PS mode, on a cluster backend (Kubernetes).

The local-backend twin is tests/e2e/test_failure_parity.py. Here the two units
run in two kwok pods, ``<job>-worker-0`` and ``<job>-worker-1``, reached
through the exec API (``--launcher local``). Unit 1 exits non-zero, or pod
``<job>-worker-1`` is deleted while the units run. kwok runs exec'd commands
as host processes that outlive their pod, so the MPI runtime never notices
the deletion by itself: the lifecycle's lost-worker watch must.
"""

import json
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from support.helpers import REPO, leftover_processes, wait_for, wait_started
from support.k8s import delete_pod_while_running, forget_pod_env, give_pods_their_env, leftover_objects

pytestmark = [pytest.mark.k8s, pytest.mark.mpi]

PROGRAM = "tests/programs/unit.py"
MODES = {
    "mpirun": ["--np", "2", "--slots-per-worker", "1"],
    "ps": ["--mode", "ps", "--workers", "2"],
}
LOST_UNITS = {"mpirun": "rank 1", "ps": "task worker:1"}


def start(job, mode, tmp_path, env, *extra):
    argv = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "k8s",
        "--image",
        "mpilaunch:test",
        "--launcher",
        "local",
        "--name",
        job,
        *MODES[mode],
        "-q",
        "--output-dir",
        str(tmp_path),
        *extra,
        "--",
        sys.executable,
        PROGRAM,
    ]
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def first_error_line(err):
    return next(line for line in err.splitlines() if line.startswith("mpilaunch: error: "))


@pytest.fixture
def pods(kube, tmp_path):
    """Each pod's own environment (what kwok's exec lacks); forgotten afterwards."""
    jobs = []

    def give(job):
        jobs.append(job)
        give_pods_their_env(kube, job, 2, tmp_path / "pods")

    yield give
    for job in jobs:
        forget_pod_env(kube, job, 2)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_unit_exit_code_is_the_job_exit_code_in_both_modes_on_k8s(kube, k8s_env, pods, mode, tmp_path):
    job = f"parity-k8s-exit-{mode}"
    pods(job)
    proc = start(job, mode, tmp_path, k8s_env, "-x", "FAIL_UNIT=1", "-x", "FAIL_CODE=7", "-x", "SLEEP=60")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 7, err[-3000:]
    assert first_error_line(err).endswith(
        f"on {'worker ' if mode == 'mpirun' else ''}{job}-worker-1 exited with code 7"
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 7 and report["lost_workers"] == [] and report["mode"] == mode
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 30, "the job's processes to end")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_lost_worker_deleted_pod_is_named_first_in_both_modes_on_k8s(kube, k8s_env, pods, mode, tmp_path):
    job = f"parity-k8s-lost-{mode}"
    pods(job)
    proc = start(job, mode, tmp_path, k8s_env, "-x", "SLEEP=120")
    wait_started(proc, 2, timeout=180)
    node, out, err, took = delete_pod_while_running(kube, proc, f"{job}-worker-1")
    assert proc.returncode == EXIT_WORKER_LOST == 5, err[-3000:]
    line = first_error_line(err)
    assert line.startswith(
        f"mpilaunch: error: worker {job}-worker-1 (pod {job}-worker-1 on node {node}) was lost: pod deleted"
    ), err[-3000:]
    assert line.endswith(f"; {LOST_UNITS[mode]} ran there"), line
    assert took < 30, f"the lost worker was noticed after {took:.0f} s"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 5 and report["lost_workers"] == [f"{job}-worker-1"]
    assert report["lost"][0]["reason"].startswith("pod deleted") and report["lost"][0]["units"] == LOST_UNITS[mode]
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 30, "the job's processes to end")
