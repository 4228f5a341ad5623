"""Ctrl-C, SIGTERM and SIGHUP around a job: raised as Interrupted in the main thread while it runs
(so every finally block releases), ignored during its teardown, and the caller's own handlers back
afterwards (an application using ``mpilaunch.run``)."""

from __future__ import annotations

import functools
import signal
import threading
from contextlib import contextmanager

from ..core.errors import Interrupted


def keeps_caller_signal_handlers(fn):
    """Whatever handlers SIGINT, SIGTERM and SIGHUP had before ``fn`` (the caller's: an
    application using ``mpilaunch.run``), they have again after it, on every exit path."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        saved = caller_signal_handlers()
        try:
            return fn(*args, **kwargs)
        finally:
            restore_signal_handlers(saved)

    return wrapper


@contextmanager
def interrupts_raise(then_ignore: bool = False):
    """SIGINT/SIGTERM/SIGHUP raise Interrupted in the main thread (so finally blocks run).

    ``then_ignore``: on the way out they are ignored instead of restored, so a second Ctrl-C
    between this block and the teardown after it cannot skip the release (the caller's
    handlers come back at the end: ``keeps_caller_signal_handlers``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}", "all workers were released")

    previous = {s: signal.signal(s, handler) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if then_ignore else h)


INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ignore_interrupts():
    """During teardown a second Ctrl-C must not abort the cleanup itself."""
    if threading.current_thread() is threading.main_thread():
        for s in INTERRUPT_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def caller_signal_handlers() -> dict | None:
    """The handlers of the interrupt signals now (None off the main thread: nothing is changed there)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.getsignal(s) for s in INTERRUPT_SIGNALS}


def restore_signal_handlers(saved: dict | None) -> None:
    """Put back what ``caller_signal_handlers`` saw (a handler installed outside Python: the default)."""
    if saved is None:
        return
    for s, handler in saved.items():
        signal.signal(s, signal.SIG_DFL if handler is None else handler)
