"""The YARN application's driver: ``python -m mpilaunch.backends.yarn.driver`` in the ApplicationMaster's container.

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

from ...core import orphan
from .orphan import HEARTBEAT_KEY


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} mpilaunch-yarn-reaper: {message}", file=sys.stderr, flush=True)


def main() -> int:
    import skein

    orphan_timeout = float(os.environ["MPILAUNCH_ORPHAN_TIMEOUT"])
    deadline_s = os.environ.get("MPILAUNCH_DEADLINE_S")
    key = os.environ.get("MPILAUNCH_YARN_KV", "mpilaunch/") + HEARTBEAT_KEY
    started = time.monotonic()
    deadline = started + float(deadline_s) if deadline_s else None
    interval = orphan.poll_interval(orphan_timeout)
    log(f"watching {key}: orphan timeout {orphan_timeout:g}s" + (f", deadline {deadline_s}s" if deadline_s else ""))
    app, seen = None, None
    while True:
        try:
            if app is None:
                app = skein.ApplicationClient.from_current()
            value = app.kv.get(key)
        except Exception as e:  # the AM not answering yet, or going down: not a verdict
            log(f"cannot read {key}: {str(e)[:200]}")
            time.sleep(interval)
            continue
        seen = orphan.observe(seen, value, time.monotonic())
        verdict = orphan.judge(seen, time.monotonic(), orphan_timeout, deadline)
        if verdict.end:
            status = "FAILED" if deadline is not None and time.monotonic() >= deadline else "KILLED"
            log(f"ending the application ({status}): {verdict.reason}")
            try:
                app.shutdown(status, diagnostics=f"mpilaunch: {verdict.reason}")
            except Exception as e:
                log(f"shutdown failed ({str(e)[:200]}); retrying")
                time.sleep(interval)
                continue
            time.sleep(60)  # skein stops the driver as the application ends
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
