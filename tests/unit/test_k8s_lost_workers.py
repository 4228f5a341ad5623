"""A failed run's diagnosis on Kubernetes: the cluster's word on the workers, once the kubelet had time to say it.

A worker whose container ends right after the kubelet saw it start (an image
that cannot run mpilaunch's pieces) is Ready for a moment; mpirun then fails
to reach it before the kubelet's next relist reports the container's end.
``lost_workers(settle=True)`` waits for that report (up to
``SETTLE_AFTER_READY_S`` after the workers turned Ready, never longer), and an
image check's own line ends the job as the wait for Ready would have:
exit 3, that line. The pods are the API server's JSON, served by a stand-in
for the API client (the real API server is exercised by the e2e tests,
among them ``test_foreign_image_without_python3_fails_at_once_naming_it``).
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jinja2")

from mpilaunch.backends.k8s import backend as k8s_backend
from mpilaunch.backends.k8s.backend import K8sBackend
from mpilaunch.cli import parse_run
from mpilaunch.core.errors import AllocationError
from mpilaunch.workloads.mpirun import MpirunWorkload

LINE = "the image img lacks python3 (3.8 or newer) on PATH"


def running(name):
    return {
        "metadata": {"name": name},
        "status": {"phase": "Running", "containerStatuses": [{"name": "worker", "state": {"running": {}}}]},
    }


def ended(name, message):
    return {
        "metadata": {"name": name},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "worker", "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": message}}}
            ],
        },
    }


class Pods:
    """The API client's part that lost_workers uses: the job's pods, as the kubelet reports them over time."""

    def __init__(self, lists):
        self.lists, self.calls = lists, 0

    def check_credentials(self):
        pass

    def get(self, *_, **__):
        self.calls += 1
        return {"items": self.lists[min(self.calls, len(self.lists)) - 1]}


def backend(tmp_path, pods: Pods) -> K8sBackend:
    spec, _ = parse_run(
        [
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            "lw",
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--launcher",
            "local",
            "--transport",
            "exec",
            "--",
            "true",
        ]
    )
    workload = MpirunWorkload.prepare(spec, K8sBackend, "lw", dict(os.environ))
    b = K8sBackend(spec, workload.plan, tmp_path)
    b._api = pods
    return b


def test_a_worker_whose_image_check_failed_after_it_looked_ready_ends_the_job_with_the_checks_line(tmp_path):
    workers = ["lw-worker-0", "lw-worker-1"]
    pods = Pods(
        [[running(n) for n in workers]] * 3 + [[ended(workers[0], f"mpilaunch: {LINE}\n"), running(workers[1])]]
    )
    b = backend(tmp_path, pods)
    b.ready_at = time.monotonic()
    assert b.lost_workers() == {}  # the run's own watch: what the API says now, no waiting
    started = time.monotonic()
    with pytest.raises(AllocationError) as raised:
        b.lost_workers(settle=True)
    assert raised.value.message == LINE and raised.value.exit_code == 3
    assert "nothing was left in the cluster" in raised.value.hint
    assert time.monotonic() - started < k8s_backend.SETTLE_AFTER_READY_S + 1


def test_the_settle_waits_only_just_after_ready_and_a_worker_lost_otherwise_is_reported(tmp_path):
    workers = ["lw-worker-0", "lw-worker-1"]
    quiet = backend(tmp_path, Pods([[running(n) for n in workers]]))
    quiet.ready_at = time.monotonic() - 60  # Ready a minute ago: the kubelet has long said all it will
    started = time.monotonic()
    assert quiet.lost_workers(settle=True) == {}
    assert time.monotonic() - started < 0.5 and quiet.api.calls == 1

    fresh = backend(tmp_path, Pods([[running(n) for n in workers]]))
    fresh.ready_at = time.monotonic()
    started = time.monotonic()
    assert fresh.lost_workers(settle=True) == {}  # nothing came: waited out the settle, then no verdict
    assert k8s_backend.SETTLE_AFTER_READY_S - 0.3 <= time.monotonic() - started < k8s_backend.SETTLE_AFTER_READY_S + 1

    oom = backend(tmp_path, Pods([[running(workers[0]), ended(workers[1], "")]]))
    oom.ready_at = time.monotonic()
    assert oom.lost_workers(settle=True) == {workers[1]: "Error (exit 3)"}  # at once: the API said it
