"""--queue: jobs under a real Kueue (v0.17, controller and webhooks: testbeds/k8s/kueue.py) on kwok nodes.

The workers are one Kueue pod group: gated, holding nothing, until the
ClusterQueue's quota admits all of them; the progress line and the
--start-timeout error say so in Kueue's words; a job Kueue preempts exits 5
naming it; nothing is left behind (Kueue's finalizer would keep deleted pods
of an unfinished group: the Workload goes first).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import pytest

from support.helpers import wait_for
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects, start, stop
from support.mpi_installs import require

pytestmark = pytest.mark.k8s

WAIT_FOR_FILE = "while [ ! -e {0} ]; do sleep 0.2; done; echo rank-on-$MPILAUNCH_WORKER"


@pytest.fixture(scope="module")
def kueue(kube):
    try:
        from testbeds.k8s.kueue import Kueue
    except ImportError as e:
        require(f"the Kueue testbed is not importable: {e}")
    try:
        k = Kueue(kube).start()
    except Exception as e:  # the testbed's own error names the cause (not built, webhooks not answering)
        require(f"Kueue did not start: {e}")
    yield k
    k.stop()


def workload(kube, job: str) -> dict | None:
    out = kube.kubectl("get", "workloads.kueue.x-k8s.io", job, "-o", "json", "--ignore-not-found").stdout
    return json.loads(out) if out.strip() else None


def conditions(obj: dict | None) -> dict[str, str]:
    return {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or ()}


def worker_pods(kube, job: str) -> list[dict]:
    return kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=worker")["items"]


class StderrLines:
    """A running job's stderr, read as it comes (the progress lines)."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stderr:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def join(self):
        self._thread.join(timeout=10)


def no_kueue_leftovers(kube, job: str) -> None:
    assert leftover_objects(kube, job) == []
    assert workload(kube, job) is None


def test_queue_admits_the_workers_as_one_kueue_group(kube, kueue, k8s_env, tmp_path):
    kueue.make_queue("mpl-cq-admit", "mpl-admit", gpus=16)
    job = "k8s-queue-admit"
    give_pods_their_env(kube, job, 2, tmp_path)
    release = tmp_path / "release"
    try:
        proc = start(
            [
                "--name",
                job,
                "--gpus",
                "16",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "-q",
                "--queue",
                "mpl-admit",
                "--",
                "sh",
                "-c",
                WAIT_FOR_FILE.format(release),
            ],
            k8s_env,
        )
        try:
            wait_for(
                lambda: len([p for p in worker_pods(kube, job) if p["status"].get("phase") == "Running"]) == 2,
                120,
                "both workers running",
            )
            pods = worker_pods(kube, job)
            admitted = workload(kube, job)
            release.touch()
            out, err = proc.communicate(timeout=120)
        finally:
            stop(proc)
        assert proc.returncode == 0, err[-3000:]
        assert out.count("rank-on-") == 16
        # one Workload of both workers, admitted by the ClusterQueue's quota
        assert conditions(admitted).get("Admitted") == "True", admitted
        assert sorted(o["name"] for o in admitted["metadata"]["ownerReferences"]) == [
            f"{job}-worker-0",
            f"{job}-worker-1",
        ]
        for pod in pods:
            labels = pod["metadata"]["labels"]
            assert labels["kueue.x-k8s.io/queue-name"] == "mpl-admit" and labels["kueue.x-k8s.io/pod-group-name"] == job
            assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
            assert not pod["spec"].get("schedulingGates")  # Kueue lifted its gate at admission
    finally:
        forget_pod_env(kube, job, 2)
    no_kueue_leftovers(kube, job)


def test_queue_holds_a_job_until_the_quota_frees_then_admits_it(kube, kueue, k8s_env, tmp_path):
    """Two jobs that each need the whole quota: the second waits, gated and bound to no node, its
    progress line quoting Kueue; it runs once the first ends. Both exit 0."""
    kueue.make_queue("mpl-cq-wait", "mpl-wait", gpus=16)
    first, second = "k8s-queue-first", "k8s-queue-second"
    for job in (first, second):
        give_pods_their_env(kube, job, 2, tmp_path)
    release = tmp_path / "release"
    try:
        a = start(
            [
                "--name",
                first,
                "--gpus",
                "16",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "-q",
                "--queue",
                "mpl-wait",
                "--",
                "sh",
                "-c",
                WAIT_FOR_FILE.format(release),
            ],
            k8s_env,
        )
        wait_for(lambda: conditions(workload(kube, first)).get("Admitted") == "True", 120, "the first job admitted")
        b = start(
            [
                "--name",
                second,
                "--gpus",
                "16",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "--queue",
                "mpl-wait",
                "--start-timeout",
                "180",
                "--",
                "echo",
                "second-ran",
            ],
            k8s_env,
        )
        progress = StderrLines(b)
        try:
            wait_for(lambda: "insufficient unused quota" in progress.text(), 60, "the queued progress line")
            time.sleep(3)  # a while queued: nothing of the second job may be bound meanwhile
            held = worker_pods(kube, second)
            assert len(held) == 2 and not any(p["spec"].get("nodeName") for p in held), held
            assert all(p["spec"].get("schedulingGates") for p in held)
            assert b.poll() is None
            release.touch()
            out_a, err_a = a.communicate(timeout=120)
            out_b, _ = b.communicate(timeout=180)
            progress.join()
        finally:
            stop(a)
            stop(b)
        assert a.returncode == 0, err_a[-3000:]
        assert b.returncode == 0, progress.text()[-3000:]
        assert out_b.count("second-ran") == 16
        line = next(x for x in progress.lines if "insufficient" in x)
        # Kueue's own reason, and the ClusterQueue it waits in
        # the pending count is the LocalQueue's status, which Kueue updates on its own schedule
        assert re.match(
            r"mpilaunch: waiting for 2 workers: 0/2 ready, queued in Kueue LocalQueue mpl-wait "
            r"\(ClusterQueue mpl-cq-wait(, 1 pending)?\): couldn't assign flavors",
            line,
        ), line
        assert "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 16 more needed" in line, line
    finally:
        for job in (first, second):
            forget_pod_env(kube, job, 2)
    for job in (first, second):
        no_kueue_leftovers(kube, job)


def test_queue_start_timeout_exits_3_naming_the_queue(kube, kueue, k8s_env):
    kueue.make_queue("mpl-cq-small", "mpl-small", gpus=8)
    job = "k8s-queue-toobig"
    t0 = time.monotonic()
    proc = start(
        [
            "--name",
            job,
            "--gpus",
            "16",
            "--gpus-per-node",
            "8",
            "--launcher",
            "local",
            "-q",
            "--queue",
            "mpl-small",
            "--start-timeout",
            "8",
            "--",
            "true",
        ],
        k8s_env,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("mpilaunch: error:")]
    assert "2 of 2 workers not ready after --start-timeout 8s" in line, line
    assert "queued in Kueue LocalQueue mpl-small (ClusterQueue mpl-cq-small" in line, line
    # more than the ClusterQueue can ever give: Kueue says so
    assert "insufficient quota for nvidia.com/gpu" in line and "> maximum capacity (8)" in line, line
    assert "waited in Kueue LocalQueue mpl-small" in err  # the hint
    assert time.monotonic() - t0 < 8 + 40
    no_kueue_leftovers(kube, job)


def test_queue_preemption_by_kueue_exits_5_naming_it(kube, kueue, k8s_env, tmp_path):
    """A running job of low priority, then one of high priority that needs its quota: Kueue evicts
    the first (its pods get TerminationTarget and are deleted); that job exits 5 saying Kueue
    preempted it and releases everything; the second runs."""
    for name, value in (("mpl-low", 100), ("mpl-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": "Never",
            }
        )
    kueue.make_queue("mpl-cq-preempt", "mpl-preempt", gpus=16, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = "k8s-queue-low", "k8s-queue-high"
    for job in (low, high):
        give_pods_their_env(kube, job, 2, tmp_path)
    try:
        a = start(
            [
                "--name",
                low,
                "--gpus",
                "16",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "-q",
                "--queue",
                "mpl-preempt",
                "--priority-class",
                "mpl-low",
                "--",
                "sleep",
                "120",
            ],
            k8s_env,
        )
        wait_for(
            lambda: len([p for p in worker_pods(kube, low) if p["status"].get("phase") == "Running"]) == 2,
            120,
            "the low-priority job running",
        )
        b = start(
            [
                "--name",
                high,
                "--gpus",
                "16",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "-q",
                "--queue",
                "mpl-preempt",
                "--priority-class",
                "mpl-high",
                "--",
                "echo",
                "high-ran",
            ],
            k8s_env,
        )
        try:
            _, err_a = a.communicate(timeout=120)
            out_b, err_b = b.communicate(timeout=180)
        finally:
            stop(a)
            stop(b)
        assert a.returncode == 5, err_a[-3000:]
        assert "evicted by Kueue (Preempted" in err_a and "Traceback" not in err_a, err_a[-3000:]
        assert b.returncode == 0, err_b[-3000:]
        assert out_b.count("high-ran") == 16
    finally:
        for job in (low, high):
            forget_pod_env(kube, job, 2)
    for job in (low, high):
        no_kueue_leftovers(kube, job)


def test_queue_sigterm_while_queued_leaves_no_gated_pod_nor_workload(kube, kueue, k8s_env):
    """Stopped while Kueue holds it (SIGTERM, as Ctrl-C's teardown): its gated pods and its Workload go;
    Kueue's finalizer would otherwise keep the deleted pods of the unfinished group."""
    kueue.make_queue("mpl-cq-term", "mpl-term", gpus=8)
    job = "k8s-queue-term"
    proc = start(
        [
            "--name",
            job,
            "--gpus",
            "16",
            "--gpus-per-node",
            "8",
            "--launcher",
            "local",
            "--queue",
            "mpl-term",
            "--start-timeout",
            "120",
            "--",
            "true",
        ],
        k8s_env,
    )
    progress = StderrLines(proc)
    try:
        wait_for(lambda: "insufficient quota" in progress.text(), 60, "the queued progress line")
        assert workload(kube, job) is not None and len(worker_pods(kube, job)) == 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        progress.join()
    finally:
        stop(proc)
    assert proc.returncode != 0 and "Traceback" not in progress.text(), progress.text()[-3000:]
    no_kueue_leftovers(kube, job)
