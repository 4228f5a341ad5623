"""A small job's wait for its pods ends at their next change, not at its next poll.

``PodEvents`` against a stream shaped like the API server's watch (one JSON
event per line, kept open): a change wakes the waiter at once, a quiet
stream lets it sleep its interval, a refused watch leaves it polling, and
closing it ends its thread. The real API server's watch is exercised by
every Kubernetes test that waits for pods.
"""

from __future__ import annotations

import socket
import threading
import time

from mpilaunch.backends.k8s.api import ApiError
from mpilaunch.backends.k8s.pod_events import PodEvents


class WatchServer:
    """What ``Api.request(stream=True)`` returns for a watch: a connection and its response."""

    def __init__(self, refuse=False):
        self.sock, self.peer = socket.socketpair()
        self.refuse, self.queries = refuse, []

    @staticmethod
    def collection_path(*_):
        return "/api/v1/namespaces/default/pods"

    def request(self, method, path, query, stream, timeout):
        self.queries.append(query)
        if self.refuse:
            raise ApiError(403, "Forbidden", 'pods is forbidden: cannot "watch"')
        return self, self.sock.makefile("rb")

    def close(self):
        self.sock.close()

    def event(self):
        self.peer.sendall(b'{"type":"MODIFIED","object":{}}\n')


def test_a_change_ends_the_wait_at_once_and_a_quiet_stream_does_not():
    server = WatchServer()
    events = PodEvents(server, "default", "mpilaunch.job=j")
    try:
        started = time.monotonic()
        events.wait(0.3)  # nothing happened: the whole interval
        assert time.monotonic() - started >= 0.29
        threading.Timer(0.05, server.event).start()
        started = time.monotonic()
        events.wait(5.0)
        assert time.monotonic() - started < 2.0
        assert server.queries[0]["watch"] == "1" and server.queries[0]["labelSelector"] == "mpilaunch.job=j"
    finally:
        events.close()
    events._thread.join(timeout=5)
    assert not events._thread.is_alive()
    server.peer.close()


def test_a_refused_watch_leaves_the_interval():
    events = PodEvents(WatchServer(refuse=True), "default", "mpilaunch.job=j")
    events._thread.join(timeout=5)
    started = time.monotonic()
    events.wait(0.2)
    assert time.monotonic() - started >= 0.19
    events.close()
