"""A worker's agent seen to end, as an event: the notes the shims leave when their agent's session
ends non-zero (``rsh_agent/shim.py`` ``record_exit``: a lost connection, a failed daemon).

An in-cluster launcher watches its workers by asking the cluster now and then (every 2 s: its
Role grants reads by name, no watch of the job's pods); a worker pod deleted under it was then
seen up to 2 s late, and a relaunch onto a spare waited for that. A shim notices first (its
agent's connection drops as the container is stopped), so the lost-worker watch asks at once
when a note appears: one directory listing every 50 ms, whatever the number of workers.
"""

from __future__ import annotations

import contextlib
import os
import threading

from ..rsh_agent.shim import EXITS_DIR

LOOK_S = 0.05


@contextlib.contextmanager
def noted_exits(rundir, interval: float = LOOK_S):
    """A ``threading.Event`` set whenever a new exit note appears in ``rundir`` (the job's context
    file's directory), while the ``with`` block lasts (``ReplacesWorkers.worker_changes``)."""
    changed, done = threading.Event(), threading.Event()
    directory = os.path.join(rundir, EXITS_DIR)

    def look() -> None:
        seen: set[str] = set()
        while not done.wait(interval):
            try:
                names = set(os.listdir(directory))
            except OSError:
                names = set()
            if names - seen:
                changed.set()
            seen = names

    thread = threading.Thread(target=look, name="exit-notes", daemon=True)
    thread.start()
    try:
        yield changed
    finally:
        done.set()
        thread.join(timeout=1.0)
