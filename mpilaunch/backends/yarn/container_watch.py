"""A watch on the job's worker containers for the lost-worker watch (``ReplacesWorkers.worker_changes``).

The lifecycle asks ``lost_workers`` every ``WATCH_INTERVAL_S`` (2 s); on YARN a lost worker
was then seen 3.5 s after its container died (measured: the NodeManager's report reaches the
ApplicationMaster in about a second, then up to 2 s for the next look), and a spare waiting to
take its place waited with it. Here a thread asks the job's own ApplicationMaster, a few times a
second, only for the containers that ended (a short answer, no load on the ResourceManager),
and sets the event when one more has: the lifecycle then looks at once. The verdict stays
``lost_workers``'s, from the same container states.
"""

from __future__ import annotations

import contextlib
import threading

# How often the ApplicationMaster is asked: one small gRPC call to the job's own AM each time.
POLL_S = 0.25


def ended_states():
    import skein

    return [skein.model.ContainerState.FAILED, skein.model.ContainerState.KILLED, skein.model.ContainerState.SUCCEEDED]


def newly_ended(seen: set[str] | None, ended: set[str]) -> bool:
    """Whether a container ended since the last answer (``seen``; None: this is the first) (pure)."""
    return seen is not None and bool(ended - seen)


@contextlib.contextmanager
def changes(app, service: str, poll_s: float = POLL_S):
    """The ``threading.Event`` set each time one more of ``service``'s containers of the application
    ``app`` (a skein ApplicationClient) has ended; None where there is no application."""
    if app is None:
        yield None
        return
    changed, done = threading.Event(), threading.Event()
    states = ended_states()

    def follow() -> None:
        seen = None
        while not done.wait(poll_s):
            try:
                ended = {c.id for c in app.get_containers(services=[service], states=states)}
            except Exception:  # the AM not answering is no verdict: the lifecycle's looks go on
                continue
            if newly_ended(seen, ended):
                changed.set()
            seen = ended

    thread = threading.Thread(target=follow, name="yarn-container-watch", daemon=True)
    thread.start()
    try:
        yield changed
    finally:
        done.set()
        thread.join(timeout=poll_s + 5.0)
