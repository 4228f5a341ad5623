"""Following the launcher's log across dropped streams: no line lost, none repeated.

The kubelet's side is modelled here by what it documents and does (every line
stamped at or after ``sinceTime``, in file order, stamps in RFC 3339 with
trailing zeros cut); a real stream cannot be dropped at a chosen line.
"""

from __future__ import annotations

import io
import threading

from mpilaunch.backends.k8s.follow import follow_log, log_time_ns, resume_point


def test_log_times_order_as_times_not_as_text():
    # as text "…01.5Z" sorts after "…01.51Z"; the old comparison skipped lines that way
    assert log_time_ns("2026-11-26T04:06:01.5Z") < log_time_ns("2026-11-26T04:06:01.51Z")
    assert log_time_ns("2026-11-26T04:06:01Z") < log_time_ns("2026-11-26T04:06:01.000000001Z")
    assert log_time_ns("2026-11-26T04:06:02Z") - log_time_ns("2026-11-26T04:06:01.999999999Z") == 1
    # a node whose clock is not on UTC writes its offset
    assert log_time_ns("2026-11-26T05:06:01.5+01:00") == log_time_ns("2026-11-26T04:06:01.5Z")


def test_resume_point_starts_a_second_early_and_counts_what_it_repeats():
    seen = [log_time_ns(s) for s in ("2026-11-26T04:06:00.2Z", "2026-11-26T04:06:01.7Z", "2026-11-26T04:06:02.3Z")]
    assert resume_point(seen) == ("2026-11-26T04:06:01Z", 2)


class KubeletLog:
    """One container's log file, served the kubelet's way; each stream drops after ``drop_after`` lines."""

    def __init__(self, entries, drop_after):
        self.entries, self.drop_after, self.queries = entries, list(drop_after), []

    @staticmethod
    def collection_path(*_):
        return "/api/v1/namespaces/default/pods"

    def request(self, method, path, query, stream, timeout):
        self.queries.append(dict(query))
        since = log_time_ns(query["sinceTime"]) if "sinceTime" in query else 0
        lines = [f"{stamp} {text}\n" for stamp, text in self.entries if log_time_ns(stamp) >= since]
        if self.drop_after:
            lines = lines[: self.drop_after.pop(0)]
        body = io.BytesIO("".join(lines).encode())
        return body, body


class Collected:
    def __init__(self, stop, total):
        self.lines, self.stop, self.total = [], stop, total

    def feed(self, stream, text):
        self.lines.append(text.rstrip("\n"))
        if len([x for x in self.lines if not x.startswith("mpilaunch:")]) >= self.total:
            self.stop.set()


def test_follow_resumes_after_drops_without_losing_or_repeating_lines():
    # stdout and stderr lines interleave out of time order (stamped as each stream is read), and
    # the stamps cut trailing zeros: the shapes that lost a rank's line before
    entries = [
        ("2026-11-26T04:06:00.9Z", "a"),
        ("2026-11-26T04:06:01.5Z", "b"),
        ("2026-11-26T04:06:01.49Z", "c"),
        ("2026-11-26T04:06:01.51234Z", "d"),
        ("2026-11-26T04:06:01.512Z", "e"),
        ("2026-11-26T04:06:02Z", "f"),
        ("2026-11-26T04:06:03.1Z", "g"),
        ("2026-11-26T04:06:03.1Z", "h"),
    ]
    for drops in ([2], [2, 1], [1, 1, 1, 1], [5, 2], [7]):
        kubelet = KubeletLog(entries, drops)
        stop = threading.Event()
        out = Collected(stop, len(entries))
        follow_log(kubelet, "default", "job-launcher", out, stop)
        resumed = [x for x in out.lines if x.startswith("mpilaunch: the launcher's log stream ended early")]
        assert [x for x in out.lines if x not in resumed] == [text for _, text in entries], drops
        assert len(resumed) == 1  # said once, however often it resumed
        assert "sinceTime" not in kubelet.queries[0] and all("sinceTime" in q for q in kubelet.queries[1:])


class OpenStream:
    """A log stream over a real socket that stays open after its lines, as the kubelet's does
    until it has seen the container exit (its next relist, up to a second later)."""

    def __init__(self, lines, late_line):
        import socket

        self.sock, self.peer = socket.socketpair()
        self.lines, self.late_line = lines, late_line

    @staticmethod
    def collection_path(*_):
        return "/api/v1/namespaces/default/pods"

    def request(self, method, path, query, stream, timeout):
        self.peer.sendall("".join(f"{stamp} {text}\n" for stamp, text in self.lines).encode())
        threading.Timer(0.01, lambda: self.peer.sendall(f"{self.late_line[0]} {self.late_line[1]}\n".encode())).start()
        return self, self.sock.makefile("rb")

    def close(self):
        self.sock.close()


def test_follow_ends_soon_after_the_launchers_last_line_with_a_late_stdout_line_kept():
    import time

    from mpilaunch.backends.k8s.follow import AFTER_DONE_S
    from mpilaunch.backends.k8s.pods import LAUNCHER_DONE

    stream = OpenStream(
        [("2026-11-26T04:06:00.1Z", "rank output"), ("2026-11-26T04:06:00.3Z", f"{LAUNCHER_DONE}0 token=t")],
        ("2026-11-26T04:06:00.2Z", "a stdout line the runtime wrote after it"),
    )
    stop, done = threading.Event(), []
    out = Collected(stop, 99)
    started = time.monotonic()
    follower = threading.Thread(
        target=follow_log,
        args=(stream, "default", "job-launcher", out, stop),
        kwargs={"on_launcher_done": done.append},
        daemon=True,
    )
    follower.start()
    follower.join(timeout=AFTER_DONE_S + 3.0)
    took = time.monotonic() - started
    stop.set()
    assert not follower.is_alive(), "still following a stream whose last line was read"
    assert done == [f"{LAUNCHER_DONE}0 token=t\n"]
    assert out.lines == ["rank output", "a stdout line the runtime wrote after it"]
    assert took < AFTER_DONE_S + 1.0  # not held until the stream closes (it never does here)
    stream.peer.close()
