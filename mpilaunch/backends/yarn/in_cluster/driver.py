"""The YARN application's driver: ``python -m mpilaunch.backends.yarn.in_cluster.driver`` in the ApplicationMaster's container.

Ends the application when the submitting mpilaunch's heartbeat (a key in
skein's key-value store, see ``backends/yarn/orphan.py``) has not changed
for ``$MPILAUNCH_ORPHAN_TIMEOUT`` seconds (final status KILLED), or after
``$MPILAUNCH_DEADLINE_S`` seconds (FAILED); the rules are
``mpilaunch/core/orphan.py``'s. skein ends the application when its driver
exits, so this never returns on its own: errors talking to the
ApplicationMaster are retried, never fatal.
"""

from __future__ import annotations

import os
import sys
import time

from ....core import env_names, orphan
from ..orphan import HEARTBEAT_KEY


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} mpilaunch-yarn-reaper: {message}", file=sys.stderr, flush=True)


def main() -> int:
    import skein

    orphan_timeout = float(os.environ[env_names.ORPHAN_TIMEOUT])
    deadline_s = os.environ.get(env_names.DEADLINE_S)
    key = os.environ.get(env_names.YARN_KV, "mpilaunch/") + HEARTBEAT_KEY
    log(f"watching {key}: orphan timeout {orphan_timeout:g}s" + (f", deadline {deadline_s}s" if deadline_s else ""))
    app = None

    def read():
        nonlocal app
        if app is None:
            app = skein.ApplicationClient.from_current()
        return app.kv.get(key)

    def shutdown(status: str, reason: str) -> None:
        app.shutdown(status, diagnostics=f"mpilaunch: {reason}")

    watch(read, shutdown, key, orphan_timeout, float(deadline_s) if deadline_s else None, time.monotonic, time.sleep)
    time.sleep(60)  # skein stops the driver as the application ends
    return 0


def watch(read, shutdown, key: str, orphan_timeout: float, deadline_s: float | None, clock, sleep) -> str:
    """Read the heartbeat every poll interval until ``orphan.judge`` ends the application; returns
    the final status that ``shutdown`` was given. A failed read is no verdict, and the time until
    the next good one no silence (``orphan.unread``)."""
    deadline = None if deadline_s is None else clock() + deadline_s
    interval = orphan.poll_interval(orphan_timeout)
    seen = None
    while True:
        asked = clock()
        try:
            value = read()
        except Exception as e:  # the AM not answering yet, or going down: not a verdict
            log(f"cannot read {key}: {str(e)[:200]}")
            seen = orphan.unread(seen)
            sleep(interval)
            continue
        now = clock()
        seen = orphan.observe(seen, value, now, asked)
        verdict = orphan.judge(seen, now, orphan_timeout, deadline)
        if verdict.end:
            status = "FAILED" if deadline is not None and now >= deadline else "KILLED"
            log(f"ending the application ({status}): {verdict.reason}")
            try:
                shutdown(status, verdict.reason)
            except Exception as e:
                log(f"shutdown failed ({str(e)[:200]}); retrying")
                sleep(interval)
                continue
            return status
        sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
