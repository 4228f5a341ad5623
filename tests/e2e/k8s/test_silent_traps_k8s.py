"""Issue 51's silent traps on Kubernetes, against the kwok testbed's real control plane
(16 kwok nodes x 8 nvidia.com/gpu; ``kube`` fixture).

a. A user whose role cannot list nodes (a tenant's usual lot: 403) gets one warning line saying
   that 8 GPUs per node is assumed, instead of nothing.
c. A program missing in the pods is refused before mpirun (the first worker is asked); one that
   is there but cannot start: every rank says "cannot start", and the terminal shows one line
   naming how many ranks said it.
e. More GPUs than the listed nodes hold is refused before anything is created; a job the
   scheduler cannot place shows the scheduler's Unschedulable reason on the progress line
   while it waits, not only in the error at --start-timeout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from support.helpers import REPO, leftover_processes, wait_for
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects, start

pytestmark = pytest.mark.k8s


def test_silent_trap_a_forbidden_node_list_is_stated_in_one_warning(kube, k8s_env, tmp_path):
    user = f"no-nodes-{uuid.uuid4().hex[:8]}"  # a user with no role at all: every list is 403
    kubeconfig = kube.client_kubeconfig(tmp_path / "user.kubeconfig", user)
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", "mpilaunch:test"]
        + ["--name", "st-forbidden", "--gpus", "16", "--dry-run", "--", "true"],
        cwd=REPO,
        env={**k8s_env, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: warning: ")]
    assert warnings == [
        "mpilaunch: warning: cannot list the cluster's nodes to count their nvidia.com/gpu (403 Forbidden: "
        "your role may not read nodes): assuming 8 GPUs per node; give --gpus-per-node G if the nodes have "
        "another number"
    ], proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "st-forbidden-worker-1" in proc.stdout  # 16 GPUs at the assumed 8 a node: 2 workers


def test_silent_trap_e_more_gpus_than_the_listed_nodes_is_refused_at_once(kube, k8s_env):
    job = "st-toomany"
    t0 = time.monotonic()
    proc = start(["--name", job, "--gpus", "256", "--start-timeout", "15", "--", "true"], k8s_env)
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("  hint: ask for at most "), err
    assert lines[0].startswith(
        "mpilaunch: error: --gpus 256 asks for more nvidia.com/gpu than the cluster has: its "
    ), err
    assert lines[0].endswith(" allocatable in all"), err
    assert elapsed < 30, elapsed  # not the --start-timeout
    assert leftover_objects(kube, job, timeout=0) == []


def test_silent_trap_e_unschedulable_reason_on_the_progress_line(kube, k8s_env):
    """--gpus-per-node skips discovery: the pods are made, and no kwok node has 16 GPUs."""
    job = "st-unsched"
    proc = start(
        ["--name", job, "--gpus", "16", "--gpus-per-node", "16", "--start-timeout", "10", "--", "true"], k8s_env
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    lines = err.splitlines()
    waiting = [line for line in lines if line.startswith("mpilaunch: waiting for 1 worker: 0/1 ready")]
    noted = [line for line in waiting if ", 1 Unschedulable: 0/" in line and "Insufficient nvidia.com/gpu" in line]
    assert noted, err
    failed = next(i for i, line in enumerate(lines) if line.startswith("mpilaunch: error: "))
    assert lines.index(noted[0]) < failed  # said while waiting, before the --start-timeout error
    assert leftover_objects(kube, job) == []


def test_silent_trap_c_missing_program_in_the_pods_is_refused_before_mpirun(kube, k8s_env, tmp_path):
    """k8s is not checked on this machine (the pods have their own files): the first worker is asked
    before mpirun starts; one error line, exit 2, no rank started, nothing left."""
    job = "st-noprog"
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = start(
            ["--name", job, "--np", "4", "--slots-per-worker", "2", "--launcher", "local", "-q"]
            + ["--", "no-such-program-51", "--flag"],
            k8s_env,
        )
        out, err = proc.communicate(timeout=180)
    finally:
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("mpilaunch: error: ")]
    assert errors == [
        f"mpilaunch: error: the program 'no-such-program-51' is not on the ranks' PATH on worker {job}-worker-0"
    ], err[-3000:]
    assert "cannot start" not in out + err and "mpilaunch: rank" not in err, err[-3000:]  # no rank ran
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 20, "the job's processes to end")


def test_silent_trap_c_a_program_that_cannot_start_in_the_pods_is_one_line(kube, k8s_env, tmp_path):
    """There but unable to start (its interpreter is missing): the ranks say it, once."""
    job = "st-nointerp"
    program = tmp_path / "no-interpreter-51"
    program.write_text("#!/no/such/interpreter\n")
    program.chmod(0o755)
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = start(
            ["--name", job, "--np", "4", "--slots-per-worker", "2", "--launcher", "local", "-q"] + ["--", str(program)],
            k8s_env,
        )
        out, err = proc.communicate(timeout=180)
    finally:
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 127, err[-3000:]
    said = [line for line in (out + err).splitlines() if f"cannot start '{program}'" in line]
    # one line on the terminal for all the ranks that said it; the failure's tail ("  | ") quotes
    # its rank's own
    shown = [line for line in said if not line.startswith("  | ")]
    assert len(shown) == 1 and re.fullmatch(
        # (mpirun may end the job before every rank said it: one rank is its own line)
        r"(mpilaunch: error: [2-4] ranks \([0-9, -]+\)|\[\d\] mpilaunch: error: rank \d): "
        rf"cannot start '{re.escape(str(program))}': No such file or directory",
        shown[0],
    ), err[-3000:]
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 20, "the job's processes to end")
