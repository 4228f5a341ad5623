"""Ctrl-C, SIGTERM and SIGHUP in ``lifecycle.run_job``: real signals, sent to this process by the fakes.

An interrupt while waiting or running ends the job with EXIT_INTERRUPTED and
everything released; a second Ctrl-C during the teardown does not cut it
short; and the caller's own signal handlers are back afterwards.
"""

from __future__ import annotations

import signal
import threading

import pytest

from mpilaunch.core.exit_codes import EXIT_INTERRUPTED
from mpilaunch.job.lifecycle import INTERRUPT_SIGNALS
from support.fake_backend import Script
from support.fake_workload import sends, succeeds


@pytest.fixture
def caller_handler():
    """A handler of the caller's (an application using mpilaunch.run) on every interrupt signal."""
    seen = []

    def handler(signum, frame):
        seen.append(signum)

    saved = {s: signal.signal(s, handler) for s in INTERRUPT_SIGNALS}
    yield handler, seen
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("signum", INTERRUPT_SIGNALS, ids=lambda s: s.name)
def test_an_interrupt_while_waiting_for_workers_exits_130_and_starts_nothing(run_fake, signum):
    job = run_fake(backend=Script(wait_ready=signum))

    assert job.result.exit_code == EXIT_INTERRUPTED
    assert job.result.failure == f"interrupted by {signum.name}"
    assert "start" not in job.log.names()
    assert job.log.count("release") == 1


def test_sigterm_while_running_stops_the_workload_and_exits_130(run_fake):
    job = run_fake(sends(signal.SIGTERM))

    assert job.result.exit_code == EXIT_INTERRUPTED
    assert job.log.args("job_finished") == [(EXIT_INTERRUPTED, "interrupted by SIGTERM")]
    names = job.log.names()
    assert names.index("stop") < names.index("release")
    assert job.report()["failure"] == "interrupted by SIGTERM"


def test_a_second_ctrl_c_during_teardown_does_not_cut_it_short(run_fake, caller_handler):
    _, seen = caller_handler
    job = run_fake(sends(signal.SIGINT), backend=Script(job_finished=signal.SIGINT, release=signal.SIGINT))

    assert job.result.exit_code == EXIT_INTERRUPTED
    assert job.log.names()[-5:] == ["describe_workers", "release", "close", "collect", "report"]
    assert not job.rundir.exists()
    assert seen == []  # ignored during the teardown, not queued for the caller


@pytest.mark.parametrize("outcome", ["success", "interrupted"])
def test_the_callers_signal_handlers_are_back_afterwards(run_fake, caller_handler, outcome):
    handler, seen = caller_handler
    run_fake(succeeds() if outcome == "success" else sends(signal.SIGINT))

    assert all(signal.getsignal(s) is handler for s in INTERRUPT_SIGNALS)
    signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM]


def test_a_keyboard_interrupt_reaches_the_caller_after_the_release(run_fake):
    job = run_fake(backend=Script(wait_ready=KeyboardInterrupt()), raises=KeyboardInterrupt)

    assert job.log.count("release") == 1
    assert not job.rundir.exists()


def test_off_the_main_thread_no_handler_is_touched(run_fake):
    before = {s: signal.getsignal(s) for s in INTERRUPT_SIGNALS}
    during = {}
    out = {}

    def look(wl, run, deadline):
        during.update({s: signal.getsignal(s) for s in INTERRUPT_SIGNALS})
        return succeeds()(wl, run, deadline)

    thread = threading.Thread(target=lambda: out.setdefault("job", run_fake(look)))
    thread.start()
    thread.join(10)

    assert out["job"].result.exit_code == 0 and out["job"].log.count("release") == 1
    assert during == before  # a launcher's thread: the main thread's handlers stay the caller's
