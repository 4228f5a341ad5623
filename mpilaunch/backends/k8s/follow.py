"""Following a pod's log as the container writes it: the cluster launcher's output and exit status
on the submitting side."""

from __future__ import annotations

import collections
import datetime
import http.client
import re
import threading
import time

from ...core.errors import AllocationError
from ...core.exit_codes import EXIT_FAILED
from . import tools
from .api import ApiError, ApiOutage
from .credentials import refused
from .pods import (
    LAUNCHER_CONTAINER,
    LAUNCHER_DONE,
    LAUNCHER_NOTES,
    LAUNCHER_READY,
    LAUNCHER_SWAP,
    launcher_exit,
    parse_launcher_done,
)

# How far before the newest line seen a reconnection asks to start: the kubelet
# stamps stdout and stderr lines as each stream is read, so its file is not
# strictly in time order, and sinceTime has whole seconds only.
RESUME_MARGIN_NS = 1_000_000_000
_SEEN_KEPT = 200_000  # timestamps kept for counting what a reconnection repeats
# After the launcher's last line the stream stays open until the kubelet has seen its container
# exit, at its next relist (up to 1 s): read this much longer, for a stdout line that the
# runtime wrote to the log after the stderr line it followed, then stop.
AFTER_DONE_S = 0.05
# How often the run reads the launcher pod while its log is followed (until its last line or its exit).
POLL = 0.5


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def log_time_ns(stamp: str) -> int:
    """A kubelet log timestamp (RFC 3339, nanoseconds, trailing zeros cut: "...:01.5Z"; a node
    not on UTC writes its offset) in ns since the epoch; ValueError for anything else.

    Compared as text, "01.5Z" sorts after "01.51Z": a reconnection skipped lines that way."""
    m = _STAMP.fullmatch(stamp)
    if m is None:
        raise ValueError(f"not a log timestamp: {stamp[:40]!r}")
    whole, fraction, zone = m.groups()
    seconds = datetime.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return int(seconds) * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


def resume_point(seen_ns) -> tuple[str, int]:
    """Where a reconnection starts (``sinceTime``) and how many of its first lines were already read.

    The kubelet sends, in file order, every line stamped at or after sinceTime:
    the lines read so far stamped that late, then the new ones."""
    since = (max(seen_ns) - RESUME_MARGIN_NS) // 1_000_000_000 * 1_000_000_000
    stamp = datetime.datetime.fromtimestamp(since // 1_000_000_000, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), sum(1 for ns in seen_ns if ns >= since)


def follow_log(
    api,
    namespace: str,
    pod: str,
    output,
    stop: threading.Event,
    on_launcher_ready=None,
    on_launcher_done=None,
    on_launcher_swap=None,
) -> None:
    """Stream the launcher's log, reconnecting after drops without repeating or losing lines.

    ``on_launcher_ready()`` is called when the launcher says it starts mpirun
    (its ``LAUNCHER_READY`` line): the submitting side's ``mpirun_started`` phase;
    ``on_launcher_done(text)`` with its last line (``LAUNCHER_DONE``), which is not output;
    ``on_launcher_swap(text)`` with a swap it made itself (``LAUNCHER_SWAP``), in the order of
    the lines around it: the ended attempt's lines come before it.
    """
    seen_ns: collections.deque = collections.deque(maxlen=_SEEN_KEPT)
    warned = resumed = done_seen = False
    while not stop.is_set():
        query = {"container": LAUNCHER_CONTAINER, "follow": "true", "timestamps": "true"}
        repeated = 0
        if seen_ns:
            query["sinceTime"], repeated = resume_point(seen_ns)
            if not resumed and not done_seen:  # once: a cut stream is worth knowing about when output looks short
                resumed = True
                output.feed(
                    "stderr",
                    f"mpilaunch: the launcher's log stream ended early; resuming from "
                    f"{query['sinceTime']} (lines already shown are skipped)\n",
                )
        path = api.collection_path("v1", "pods", namespace) + f"/{pod}/log"
        try:
            conn, resp = api.request("GET", path, query=query, stream=True, timeout=3600)
        except (ApiError, OSError) as e:
            if not warned:
                warned = True
                output.feed("stderr", f"mpilaunch: waiting for the launcher's log ({str(e)[:200]})\n")
            stop.wait(2.0)
            continue
        try:
            for raw in iter(resp.readline, b""):
                if repeated:
                    repeated -= 1
                    continue
                line = raw.decode("utf-8", "replace")
                stamp, _, text = line.partition(" ")
                try:
                    seen_ns.append(log_time_ns(stamp))
                except ValueError:
                    pass  # not a stamped line (never seen): shown, not counted
                if on_launcher_done is not None and text.startswith(LAUNCHER_DONE):
                    done_seen = True  # its last line
                    on_launcher_done(text)
                    if getattr(conn, "sock", None) is not None:
                        conn.sock.settimeout(AFTER_DONE_S)
                    continue
                if on_launcher_swap is not None and text.startswith(LAUNCHER_SWAP):
                    on_launcher_swap(text)  # bookkeeping, not output
                    continue
                if on_launcher_ready is not None and text.startswith(LAUNCHER_READY):
                    on_launcher_ready(text[len(LAUNCHER_READY) :])
                if text.startswith(LAUNCHER_NOTES):  # its own verdicts: not mpirun's output
                    output.note(text)
                    continue
                output.feed("stdout", text)
        except (
            OSError,
            http.client.HTTPException,
        ):  # a dropped stream (cut mid-chunk: IncompleteRead), or AFTER_DONE_S passed
            pass
        finally:
            conn.close()
        if done_seen:
            return
        stop.wait(0.5)


def run_launcher(
    api, namespace: str, pod: str, status_token: str, output, deadline: float | None, on_ready, on_swap=None
) -> int | None:
    """Follow the launcher pod: its log into ``output``, its exit code back; ``on_ready(said)`` when
    the launcher says it starts mpirun, ``on_swap(text)`` when it swapped a spare in itself.

    None when ``deadline`` passed first (the workload reports the timeout).
    """
    stop, said_done = threading.Event(), threading.Event()
    done: list[int] = []

    def on_done(text: str) -> None:
        code = parse_launcher_done(text, status_token)
        if code is not None:
            done.append(code)
            said_done.set()

    follower = threading.Thread(
        target=follow_log,
        args=(api, namespace, pod, output, stop),
        kwargs={"on_launcher_ready": on_ready, "on_launcher_done": on_done, "on_launcher_swap": on_swap},
        daemon=True,
    )
    follower.start()
    code = None
    outage = ApiOutage(f"the launcher pod {pod}")
    try:
        while True:
            if done:  # its last line, every line before it read: no need to wait for the kubelet
                code = done[0]
                return code
            api.check_credentials()
            try:
                current = api.get("v1", "pods", pod)
                outage.ok()
            except ApiError as e:
                if e.status == 404:
                    output.feed("stderr", f"mpilaunch: launcher pod {pod} disappeared\n")
                    return EXIT_FAILED
                if e.status == 403:
                    raise refused(e.status, e.message, f"reading the launcher pod {pod}") from None
                current = outage.failed(e)
            except OSError as e:
                current = outage.failed(e)
            if current is not None:
                code = launcher_exit(current)
                line = tools.image_problem(tools.termination_messages(current)) if code else None
                if line:
                    raise AllocationError(line, tools.HINT)
                if code is not None:
                    return code
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if output.abandoned():
                return EXIT_FAILED  # misplaced ranks or a lost worker: the lifecycle reports it and deletes the job
            said_done.wait(POLL)
    finally:
        stop.set()
        follower.join(timeout=10 if code is not None else 1)
