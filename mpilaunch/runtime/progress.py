"""Progress while waiting for workers: rich on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time


class WaitProgress:
    """Callable ``progress(ready, total, note=None)``; use as a context manager.

    ``note``: why the rest waits, when someone other than the scheduler decides (a gang, a queue)."""

    def __init__(self, what: str, stream=None, quiet: bool = False):
        self.what = what
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.started = time.monotonic()
        self._last = None
        self._last_print = 0.0
        self._rich = None

    def __enter__(self):
        if not self.quiet and getattr(self.stream, "isatty", lambda: False)():
            try:
                from rich.progress import Progress

                self._rich = Progress(transient=True)
                self._rich.start()
                self._task = self._rich.add_task(self.what, total=None)
            except ImportError:
                self._rich = None
        return self

    def __call__(self, ready: int, total: int, note: str | None = None) -> None:
        if self.quiet:
            return
        if self._rich is not None:
            self._rich.update(
                self._task, completed=ready, total=total, description=f"{self.what} ({note})" if note else self.what
            )
            return
        now = time.monotonic()
        # Plain output: on change, and a heartbeat every 5 s while stuck.
        if (ready, total, note) != self._last or now - self._last_print > 5:
            self._last, self._last_print = (ready, total, note), now
            print(
                f"mpilaunch: {self.what}: {ready}/{total} ready"
                + (f", {note}" if note else "")
                + f" ({now - self.started:.1f}s)",
                file=self.stream,
                flush=True,
            )

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.stop()
        return False
