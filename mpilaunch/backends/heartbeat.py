"""The submitting side's heartbeat: a thread that renews something in the cluster every few seconds.

What is renewed is the backend's business (a Kubernetes Lease, a key in
skein's key-value store); a reaper in the cluster ends the job once the
renewals stop for ``--orphan-timeout`` (``mpilaunch/core/orphan.py``). The thread
is a daemon: when this process dies, renewals stop, which is the point.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

from ..core.orphan import renew_interval


class Heartbeat:
    """Calls ``renew()`` now and then every ``renew_interval(orphan_timeout)`` seconds until stopped.

    ``renew`` returns False when there is nothing left to renew (the job was
    deleted); errors are retried on the next beat: a short API outage must
    not stop the heartbeat for good. Two failures in a row are said once on
    stderr (``what`` names the heartbeat): a job that gets reaped while
    mpilaunch still runs must not be a mystery.
    """

    def __init__(self, renew: Callable[[], bool], orphan_timeout: float, what: str, name: str = "mpilaunch-heartbeat"):
        self.renew = renew
        self.orphan_timeout = orphan_timeout
        self.what = what
        self.interval = renew_interval(orphan_timeout)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _run(self) -> None:
        streak = 0
        while not self._stop.is_set():
            try:
                if self.renew() is False:
                    return
                streak = 0
            except Exception as e:
                self.failures += 1
                streak += 1
                if streak == 2:
                    print(
                        f"mpilaunch: warning: cannot renew {self.what} ({str(e)[:200]}); the cluster ends the job "
                        f"--orphan-timeout {self.orphan_timeout:g}s after the last renewal",
                        file=sys.stderr,
                    )
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
