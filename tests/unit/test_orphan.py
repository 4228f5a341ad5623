"""The orphan-timeout rules (pure) and the --orphan-timeout option.

The reaper's decision is a pure function of what it saw and when, on its
own clock; the cluster tests (``-k sigkill``) prove the rest end to end.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpilaunch.core.orphan import (
    DEADLINE_MARGIN_S,
    Seen,
    cluster_deadline_s,
    judge,
    observe,
    poll_interval,
    renew_interval,
)
from support.helpers import REPO


def test_the_first_reading_is_fresh_whatever_it_says():
    """A reaper that starts (or restarts) late gives the host a full timeout before judging."""
    seen = observe(None, "2020-01-01T00:00:00.000000Z", now=1000.0)
    assert seen == Seen("2020-01-01T00:00:00.000000Z", 1000.0, silent=0.0, blind=False)
    assert not judge(seen, now=1009.0, orphan_timeout=10).end


def test_a_changing_heartbeat_keeps_the_job_alive_forever():
    seen = None
    for i in range(100):
        seen = observe(seen, f"t{i}", now=i * 3.0)
        assert not judge(seen, now=i * 3.0 + 2.9, orphan_timeout=10).end


def test_a_heartbeat_that_stops_changing_ends_the_job_after_the_timeout():
    seen = observe(None, "t0", now=0.0)
    seen = observe(seen, "t1", now=5.0)
    for now in (6.0, 10.0, 14.9):
        seen = observe(seen, "t1", now=now)
        assert judge(seen, now, orphan_timeout=10) == (False, None)
    seen = observe(seen, "t1", now=15.0)
    verdict = judge(seen, 15.0, orphan_timeout=10)
    assert verdict.end
    assert verdict.reason == (
        "no heartbeat from the submitting mpilaunch for 10s (--orphan-timeout 10s): "
        "it was killed or lost its connection"
    )


def test_a_missing_heartbeat_counts_as_a_value_that_does_not_change():
    """The key not written yet (None) is judged like any stale value: from when it was first seen."""
    seen = observe(None, None, now=0.0)
    assert observe(seen, None, now=8.0).silent == 8.0  # counted from the first reading
    assert judge(observe(seen, None, now=8.0), 12.0, orphan_timeout=12).end
    assert judge(seen, 12.0, orphan_timeout=12).end
    assert not judge(observe(seen, "t", now=11.0), 12.0, orphan_timeout=12).end


def test_clock_skew_between_host_and_cluster_does_not_matter():
    """Values are compared for change, never as times: a host clock an hour behind changes nothing."""
    seen = observe(None, "1999-01-01T00:00:00.000000Z", now=0.0)
    seen = observe(seen, "1999-01-01T00:00:04.000000Z", now=4.0)
    assert not judge(seen, 13.0, orphan_timeout=10).end


def test_the_deadline_ends_even_a_live_job():
    seen = observe(None, "t", now=99.0)
    verdict = judge(seen, now=100.0, orphan_timeout=60, deadline=100.0)
    assert verdict.end and "cluster-side deadline" in verdict.reason
    assert not judge(seen, now=99.9, orphan_timeout=60, deadline=100.0).end


def test_cluster_deadline_is_start_timeout_plus_timeout_plus_margin():
    assert cluster_deadline_s(300, None) is None
    assert cluster_deadline_s(300, 600) == 300 + 600 + DEADLINE_MARGIN_S
    assert cluster_deadline_s(1.5, 2.2) == int(1.5 + 2.2 + DEADLINE_MARGIN_S) + 1  # rounded up, never early


@pytest.mark.parametrize("timeout, renew, poll", [(3, 0.75, 0.6), (10, 2.5, 2.0), (60, 5.0, 5.0), (3600, 5.0, 5.0)])
def test_several_renewals_and_polls_fit_in_one_timeout(timeout, renew, poll):
    assert renew_interval(timeout) == renew and poll_interval(timeout) == poll
    assert timeout / renew_interval(timeout) >= 4


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("abc", "argument --orphan-timeout: invalid float value: 'abc'"),
        ("0", "--orphan-timeout must be a finite number of seconds, at least 3; got 0"),
        ("-5", "--orphan-timeout must be a finite number of seconds, at least 3; got -5"),
        ("inf", "--orphan-timeout must be a finite number of seconds, at least 3; got inf"),
    ],
)
def test_bad_orphan_timeout_is_one_line_and_a_hint_exit_2(value, message):
    proc = _run("--backend", "k8s", "--orphan-timeout", value, "--", "true")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == f"mpilaunch: error: {message}"
    assert len(lines) == 2 and lines[1].startswith("  hint: ")


def test_help_documents_the_orphan_timeout():
    out = " ".join(_run("--help").stdout.split())
    assert "--orphan-timeout SEC" in out and "(default 60)" in out


def test_heartbeat_keeps_renewing_through_failures_and_says_so_once(capfd):
    """A short outage must not stop the renewals; a job about to be reaped says why, once."""
    import time

    from mpilaunch.backends.heartbeat import Heartbeat

    calls = []

    def renew():
        calls.append(time.monotonic())
        if len(calls) in (2, 3, 4):
            raise ConnectionError("connection refused")
        return True

    beat = Heartbeat(renew, 3, "the test's key").start()  # renews every 0.75 s
    time.sleep(4.0)
    beat.stop()
    assert len(calls) >= 5 and beat.failures == 3
    err = capfd.readouterr().err
    assert err.count("mpilaunch: warning: cannot renew the test's key (connection refused)") == 1, err
    assert "--orphan-timeout 3s after the last renewal" in err


def test_heartbeat_stops_when_there_is_nothing_left_to_renew():
    from mpilaunch.backends.heartbeat import Heartbeat

    calls = []

    def renew():
        calls.append(1)
        return False  # e.g. the Lease is gone: the job was deleted

    beat = Heartbeat(renew, 3, "x").start()
    beat._thread.join(timeout=5)
    assert calls == [1] and not beat._thread.is_alive()


def test_k8s_relay_ends_with_its_mpilaunch_through_a_pidfd(tmp_path):
    """The exec relay (one per k8s job, holding the credentials) leaves as soon as the process it
    serves is gone: it waits on a pidfd, which a reused pid cannot keep alive."""
    import json as _json
    import subprocess as _sp
    import sys as _sys
    import time as _time

    owner = _sp.Popen(["sleep", "60"])
    context = tmp_path / "context.json"
    context.write_text(_json.dumps({"server": "https://127.0.0.1:9", "insecure": True}))
    relay = _sp.Popen(
        [
            _sys.executable,
            "-m",
            "mpilaunch.backends.k8s.exec_path.relay",
            str(context),
            str(tmp_path / "s"),
            "--exit-with-pid",
            str(owner.pid),
        ],
        stdout=_sp.PIPE,
    )
    try:
        assert relay.stdout.readline()  # READY
        _time.sleep(0.3)
        assert relay.poll() is None  # serves while its owner lives
        owner.kill()
        owner.wait()
        t0 = _time.monotonic()
        relay.wait(timeout=5)
        assert _time.monotonic() - t0 < 0.5  # at once, not at the next 1 s poll
    finally:
        for p in (owner, relay):
            if p.poll() is None:
                p.kill()
                p.wait()
