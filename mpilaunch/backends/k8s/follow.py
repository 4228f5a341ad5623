"""Following a pod's log as the container writes it: the cluster launcher's output on the submitting side."""

from __future__ import annotations

import threading

from .api import ApiError
from .pods import LAUNCHER_CONTAINER, LAUNCHER_DONE, LAUNCHER_READY


def follow_log(api, namespace: str, pod: str, output, stop: threading.Event, on_launcher_ready=None,
               on_launcher_done=None) -> None:
    """Stream the launcher's log, reconnecting after drops without repeating lines.

    ``on_launcher_ready()`` is called when the launcher says it starts mpirun
    (its ``LAUNCHER_READY`` line): the submitting side's ``mpirun_started`` phase;
    ``on_launcher_done(text)`` with its last line (``LAUNCHER_DONE``), which is not output.
    """
    last_ts, seen_at_last = None, 0
    warned = False
    while not stop.is_set():
        query = {"container": LAUNCHER_CONTAINER, "follow": "true", "timestamps": "true"}
        if last_ts:
            query["sinceTime"] = last_ts.split(".")[0] + "Z" if "." in last_ts else last_ts
        path = api.collection_path("v1", "pods", namespace) + f"/{pod}/log"
        try:
            conn, resp = api.request("GET", path, query=query, stream=True, timeout=3600)
        except (ApiError, OSError) as e:
            if not warned:
                warned = True
                output.feed("stderr", f"mpilaunch: waiting for the launcher's log ({str(e)[:200]})\n")
            stop.wait(2.0)
            continue
        skipped = 0
        try:
            for raw in iter(resp.readline, b""):
                line = raw.decode("utf-8", "replace")
                ts, _, text = line.partition(" ")
                if last_ts is not None and ts <= last_ts:
                    if ts == last_ts and skipped < seen_at_last:
                        skipped += 1
                        continue
                    if ts < last_ts:
                        continue
                if ts == last_ts:
                    seen_at_last += 1
                else:
                    last_ts, seen_at_last = ts, 1
                if on_launcher_done is not None and text.startswith(LAUNCHER_DONE):
                    on_launcher_done(text)
                    continue
                if on_launcher_ready is not None and text.startswith(LAUNCHER_READY):
                    on_launcher_ready(text[len(LAUNCHER_READY):])
                output.feed("stdout", text)
        except OSError:
            pass
        finally:
            conn.close()
        stop.wait(0.5)
