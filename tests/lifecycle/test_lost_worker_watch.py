"""The lost-worker watch (job/lifecycle.py LostWorkerWatch): it looks at the backend's workers every
interval, and at once where the backend says a worker changed (``ReplacesWorkers.worker_changes``:
on Kubernetes a watch on the job's pods), so that a deleted pod stops mpirun, and a --retries
relaunch or a spare starts, without waiting out the interval. Real threads, a scripted backend."""

from __future__ import annotations

import contextlib
import threading
import time

from mpilaunch.backends.protocols import ReplacesWorkers
from mpilaunch.job.lifecycle import LostWorkerWatch


class Workload:
    def __init__(self):
        self.stopped = threading.Event()
        self.notes: list[str] = []

    def note_stop(self, text: str, broken: bool = False) -> None:
        self.notes.append(text)
        self.broken = broken

    def stop(self) -> None:
        self.stopped.set()


class ChangingBackend(ReplacesWorkers):
    """lost_workers says worker w1 is gone once ``gone`` is set; worker_changes gives ``changed``."""

    def __init__(self, signals: bool):
        self.gone = threading.Event()
        self.changed = threading.Event()
        self.signals = signals
        self.looks = 0

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        self.looks += 1
        return {"w1": "deleted"} if self.gone.is_set() else {}

    def replace_workers(self, names, why="lost"):
        return {}

    def worker_changes(self):
        return contextlib.nullcontext(self.changed if self.signals else None)


def test_a_worker_change_is_looked_at_at_once_not_at_the_next_interval():
    backend, workload = ChangingBackend(signals=True), Workload()
    with LostWorkerWatch(backend, workload, interval=60.0) as watch:
        time.sleep(0.2)
        t0 = time.monotonic()
        backend.gone.set()
        backend.changed.set()  # the pod watch's event
        assert workload.stopped.wait(5.0), "the watch did not look at the change"
        took = time.monotonic() - t0
    assert watch.lost == {"w1": "deleted"} and took < 1.0, took
    assert workload.notes == ["after worker w1 was lost"] and workload.broken  # no long grace for a broken run


def test_without_a_signal_the_watch_keeps_its_interval_and_ends_at_once():
    backend, workload = ChangingBackend(signals=False), Workload()
    t0 = time.monotonic()
    with LostWorkerWatch(backend, workload, interval=60.0):
        backend.gone.set()
        time.sleep(0.3)
    assert not workload.stopped.is_set() and backend.looks == 0  # the next look is 60 s away
    assert time.monotonic() - t0 < 2.0  # leaving does not wait for it
