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


def test_a_large_job_sleeps_its_interval_and_a_small_one_is_woken_and_its_watch_closed():
    import contextlib

    from mpilaunch.backends.k8s.pod_events import waiter
    from mpilaunch.backends.k8s.pods import FAST_POLL_PODS

    with waiter(WatchServer(), "default", "mpilaunch.job=j", FAST_POLL_PODS + 1) as wait:
        assert wait is time.sleep
    server = WatchServer()
    with contextlib.ExitStack() as stack:
        wait = stack.enter_context(waiter(server, "default", "mpilaunch.job=j", 2))
        events = wait.__self__
        threading.Timer(0.05, server.event).start()
        started = time.monotonic()
        wait(5.0)
        assert time.monotonic() - started < 2.0
    events._thread.join(timeout=5)
    assert not events._thread.is_alive()  # closed on the way out
    server.peer.close()


def test_release_waits_until_the_pods_are_gone():
    from mpilaunch.backends.k8s.manage import wait_pods_gone

    class Pods(WatchServer):
        namespace = "default"

        def __init__(self):
            super().__init__()
            self.lists = [2, 2, 1, 0]

        def get(self, *_, **__):
            return {"items": [{}] * self.lists.pop(0)}

    api = Pods()
    wait_pods_gone(api, "mpilaunch.job=j", 10.0)
    assert api.lists == []  # looked until none was left, and not once more
    api.peer.close()


def test_the_cluster_launcher_wakes_when_the_pod_it_waits_for_changes_and_watches_one_pod_by_name(monkeypatch):
    """The launcher's Role names its pods, so it watches one at a time, the first not yet Ready;
    that pod's change, not its 5 s poll, ends the wait, and the next pending pod is watched next."""
    from mpilaunch.backends.k8s.in_cluster import launcher

    monkeypatch.setattr(launcher, "ready_poll_s", lambda *_: 5.0)
    ready_pod = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    class Watch:
        def __init__(self):
            self.sock, self.peer = socket.socketpair()

        def close(self):
            self.sock.close()

    class Api:
        """Pods by name, and a new watch stream per request (as the API server opens one per watch)."""

        namespace = "default"

        def __init__(self):
            self.ready, self.queries, self.watches = set(), [], []

        @staticmethod
        def collection_path(*_):
            return "/api/v1/namespaces/default/pods"

        def request(self, method, path, query, stream, timeout):
            self.queries.append(query)
            self.watches.append(Watch())
            return self.watches[-1], self.watches[-1].sock.makefile("rb")

        def get(self, version, kind, name):
            return ready_pod if name in self.ready else {"status": {"phase": "Pending"}}

        def event(self):
            for w in self.watches:
                try:
                    w.peer.sendall(b'{"type":"MODIFIED","object":{}}\n')
                except OSError:
                    pass  # a watch the launcher closed

    api = Api()

    def turn_ready(names):
        api.ready.update(names)
        api.event()

    threading.Timer(0.2, turn_ready, [["w-0"]]).start()
    threading.Timer(0.6, turn_ready, [["w-1"]]).start()
    started = time.monotonic()
    pods = launcher.wait_workers(api, ["w-0", "w-1"], time.monotonic() + 30)
    assert time.monotonic() - started < 3.0  # woken by the changes: two 5 s polls would be 10 s
    assert set(pods) == {"w-0", "w-1"}
    selectors = [q.get("fieldSelector") for q in api.queries]
    assert selectors[0] == "metadata.name=w-0" and "metadata.name=w-1" in selectors
    assert all("labelSelector" not in q for q in api.queries)  # never the namespace's pods
    for w in api.watches:
        w.peer.close()


class HttpWatch:
    """A real HTTP server streaming a chunked watch, and ``request(stream=True)`` answered by the real
    http.client: its response's close is what races between the watch's thread and ``close``."""

    def __init__(self):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                line = b'{"type":"MODIFIED","object":{}}\n'
                try:
                    while True:  # a busy watch: events all the time, so close() meets a read in flight
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        time.sleep(0.001)
                except OSError:
                    pass

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def collection_path(*_):
        return "/api/v1/namespaces/default/pods"

    def request(self, method, path, query, stream, timeout):
        import http.client

        conn = http.client.HTTPConnection(*self.server.server_address, timeout=timeout)
        conn.request(method, path)
        return conn, conn.getresponse()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_closing_a_busy_watch_never_raises_from_http_client(monkeypatch):
    """close() while the watch's thread reads: both used to close the response at once, and
    http.client raised AttributeError ('NoneType' object has no attribute 'close') out of the job's
    wait for its pods (seen once on the real node, an 8-pod job). The race's window is a few
    bytecodes wide in CPython's HTTPResponse.close (``if self.fp:`` ... ``self._close_conn()``);
    the test widens it to 20 ms, as a loaded machine's scheduler sometimes does."""
    import http.client
    import io

    def close_with_a_window(self):
        io.BufferedIOBase.close(self)
        if self.fp:
            time.sleep(0.02)  # the other thread may close the file here
            self._close_conn()

    monkeypatch.setattr(http.client.HTTPResponse, "close", close_with_a_window)
    server = HttpWatch()
    try:
        for _ in range(5):
            events = PodEvents(server, "default", "mpilaunch.job=j")
            events.wait(0.05)  # its thread is reading events
            events.close()
            events._thread.join(timeout=5)
            assert not events._thread.is_alive()
    finally:
        server.stop()
