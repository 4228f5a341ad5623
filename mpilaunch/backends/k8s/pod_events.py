"""Wake a poll loop as soon as one of a job's pods changes.

The CLI's wait for its pods lists them, judges, and sleeps until the next
look. A watch on the same label selector ends that sleep at the pod's first
change instead of up to a poll interval later (0.1 s for a small job: the
Ready condition arrives at the kubelet's relist, and every 50 ms on average
between it and the next look is lost before mpirun can start). The loop's
logic stays the list's; the watch only says when to look again. Where the
watch is refused or drops, the loop sleeps its interval as before.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from .api import ApiError
from .pods import FAST_POLL_PODS


@contextlib.contextmanager
def watching(api, namespace: str, selector: str, pods: int):
    """A ``PodEvents`` on ``pods`` pods, closed on the way out; None for a large job (more than
    ``FAST_POLL_PODS``), whose pods change too often for a list of them all at each change."""
    if pods > FAST_POLL_PODS:
        yield None
        return
    events = PodEvents(api, namespace, selector)
    try:
        yield events
    finally:
        events.close()


@contextlib.contextmanager
def waiter(api, namespace: str, selector: str, pods: int):
    """``wait(seconds)`` for a loop that looks at ``pods`` pods: it returns at their next change,
    a large job's sleeps its interval."""
    with watching(api, namespace, selector, pods) as events:
        yield time.sleep if events is None else events.wait


@contextlib.contextmanager
def changes(api, namespace: str, selector: str, pods: int):
    """The ``threading.Event`` a watch on ``pods`` pods sets at each change
    (``ReplacesWorkers.worker_changes``); None for a large job."""
    with watching(api, namespace, selector, pods) as events:
        yield None if events is None else events.changed


# how long close() waits for the watch's thread to see its socket shut down (at once, normally)
JOIN_S = 1.0


class PodEvents:
    """A watch on the pods matching ``selector`` that sets an event on every change.

    ``by``: which selector it is, ``labelSelector`` or ``fieldSelector``; a watch on one pod by
    name (``metadata.name=NAME``) is what a Role that names its pods may grant.
    """

    def __init__(self, api, namespace: str, selector: str, by: str = "labelSelector"):
        self._api, self._namespace, self._selector, self._by = api, namespace, selector, by
        self.changed = threading.Event()
        self._closed = False
        self._conn = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, name="pod-events", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        path = self._api.collection_path("v1", "pods", self._namespace)
        query = {self._by: self._selector, "watch": "1", "timeoutSeconds": "600"}
        try:
            conn, resp = self._api.request("GET", path, query=query, stream=True, timeout=630)
        except (ApiError, OSError):
            return  # refused (no "watch" on pods) or unreachable: the loop keeps its interval
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conn = conn
        try:
            for _ in iter(resp.readline, b""):
                self.changed.set()
        except Exception:  # closed under it (close(): http.client raises what it will), or
            pass  # dropped: either way the loop keeps its interval

    def wait(self, timeout: float) -> None:
        """Until a pod changed since the last call, or ``timeout`` seconds."""
        self.changed.wait(timeout)
        self.changed.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:  # wakes the thread's read (a close alone waits for the response to let go of it)
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            # The woken read closes the response itself at its EOF; closing it from here at the
            # same moment races in http.client (both threads take its file, one finds None: seen,
            # an AttributeError out of the job's wait for its pods on the real node). Let the
            # thread end first; a close after it finds the response closed.
            self._thread.join(timeout=JOIN_S)
            try:
                conn.close()
            except (AttributeError, OSError):
                pass  # the thread still closing it (a join that timed out): it ends as a daemon


class FirstPendingWatch:
    """For a Role that names its pods: a watch on one pod at a time, by name, the first of those
    still pending; ``wait(pending, seconds)`` until it changes (or the seconds pass)."""

    def __init__(self, api):
        self.api, self.name, self.events = api, None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait(self, pending: list[str], seconds: float) -> None:
        if pending[0] != self.name:
            self.close()
            self.name = pending[0]
            self.events = PodEvents(self.api, self.api.namespace, f"metadata.name={self.name}", by="fieldSelector")
        self.events.wait(seconds)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None
