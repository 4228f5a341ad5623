"""`mpilaunch.run` inside an application: the application's signal handlers survive the call.

While a job runs, SIGINT, SIGTERM and SIGHUP end it (and release every
worker); afterwards they must be the caller's again, whatever they were,
on every exit path: success, a failing rank, an interrupt.
"""

import os
import signal
import sys
import threading
import time

import pytest

from support.helpers import REPO, leftover_processes, mpilaunch_env

pytestmark = pytest.mark.mpi

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture
def caller_handlers(openmpi5, monkeypatch):
    """Custom handlers of the test process, as an application's; the originals come back afterwards."""
    for k, v in mpilaunch_env(openmpi5).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    received = []
    mine = {s: (lambda signum, _frame, s=s: received.append(signum)) for s in SIGNALS}
    mine[signal.SIGHUP] = signal.SIG_IGN  # not only functions: SIG_IGN must come back too
    before = {s: signal.signal(s, mine[s]) for s in SIGNALS}
    try:
        yield mine, openmpi5, received
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def assert_handlers_are(expected):
    for s in SIGNALS:
        assert signal.getsignal(s) is expected[s], f"{signal.Signals(s).name}: {signal.getsignal(s)!r}"


def test_api_restores_caller_signal_handlers_after_a_successful_job(caller_handlers):
    import mpilaunch

    mine, install, received = caller_handlers
    result = mpilaunch.run([sys.executable, "-c", "pass"], np=2, mpirun=install.mpirun, name="api-sig-ok")
    assert result.exit_code == 0, result.failure
    assert_handlers_are(mine)


def test_api_restores_caller_signal_handlers_after_a_failing_job(caller_handlers):
    import mpilaunch

    mine, install, received = caller_handlers
    result = mpilaunch.run(
        [sys.executable, "-c", "import sys; sys.exit(3)"], np=2, mpirun=install.mpirun, name="api-sig-fail"
    )
    assert result.exit_code == 3, result.failure
    assert_handlers_are(mine)


def test_api_restores_caller_signal_handlers_after_sigterm_ended_the_job(caller_handlers, tmp_path):
    import mpilaunch

    mine, install, received = caller_handlers
    started = tmp_path / "started"
    program = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"

    def terminate_once_running():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # mpilaunch's handler, not the caller's, gets this one

    killer = threading.Thread(target=terminate_once_running, daemon=True)
    killer.start()
    t0 = time.monotonic()
    result = mpilaunch.run([sys.executable, "-c", program], np=1, mpirun=install.mpirun, name="api-sig-term")
    killer.join(timeout=5)
    assert result.exit_code == 130, result.failure
    assert time.monotonic() - t0 < 50
    assert_handlers_are(mine)
    assert received == []  # the SIGTERM was mpilaunch's to handle while the job ran
    assert leftover_processes("api-sig-term") == []
