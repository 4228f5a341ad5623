"""When an expiring token is fetched again, when mpilaunch gives up, and what an outage says.

Pure logic of ``backends/k8s/credentials.py`` and ``backends/k8s/api.py``'s ``ApiOutage``;
the same code against a real API server with 20-second tokens is
``tests/e2e/k8s/test_k8s_token.py``.
"""

from __future__ import annotations

import io
import os
import stat
import threading
import time

import pytest

from mpilaunch.backends.k8s.api import ApiOutage
from mpilaunch.backends.k8s.credentials import CredentialError, Token, TokenSource, give_up_at, refresh_at, refused


def test_token_refresh_at_half_life_and_give_up_with_a_quarter_left():
    eks = Token("t", issued=1000.0, expires=1900.0)  # 15 minutes
    assert refresh_at(eks) == 1450.0
    assert give_up_at(eks) == 1900.0 - 225.0
    short = Token("t", issued=0.0, expires=20.0)
    assert refresh_at(short) == 10.0
    assert give_up_at(short) == 10.0  # never less than 10 s left for the teardown
    static = Token("t", issued=0.0, expires=None)
    assert refresh_at(static) is None and give_up_at(static) is None


def test_token_401_fetches_once_and_a_failing_fetch_is_the_jobs_error():
    fetched = []

    def fetch():
        fetched.append(1)
        if len(fetched) > 1:
            raise CredentialError("cluster credentials failed: the plugin failed (boom)")
        return Token(f"t{len(fetched) + 1}", time.time(), None)

    source = TokenSource(fetch, Token("t1", time.time(), None))
    assert source.after_unauthorized("t1") and source.current() == "t2"
    assert source.after_unauthorized("t1")  # another thread refreshed already: just send again
    assert len(fetched) == 1
    heard = []
    source.on_failure.append(heard.append)
    assert not source.after_unauthorized("t2")
    with pytest.raises(CredentialError, match="boom"):
        source.check()
    assert len(heard) == 1


def test_token_refreshed_in_the_background_and_written_whole(tmp_path):
    path = tmp_path / "k8s-token"
    count = iter(range(2, 100))

    def fetch():
        return Token(f"token-{next(count)}", time.time(), time.time() + 0.4)

    source = TokenSource(fetch, Token("token-1", time.time(), time.time() + 0.4), path).start()
    try:
        deadline = time.monotonic() + 5
        while source.refreshes < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        source.stop()
    assert source.refreshes >= 3
    assert path.read_text() == source.current()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_token_refresh_failing_gives_up_while_the_last_token_still_works(monkeypatch, capsys):
    import mpilaunch.backends.k8s.credentials as creds

    monkeypatch.setattr(creds, "GIVE_UP_MIN_S", 0.3)
    monkeypatch.setattr(creds, "RETRY_S", 0.05)
    first = Token("t1", time.time(), time.time() + 1.0)

    def fetch():
        raise CredentialError("cluster credentials failed: the kubeconfig's exec plugin 'p' failed (gone)")

    failed = threading.Event()
    source = TokenSource(fetch, first)
    source.on_failure.append(lambda e: failed.set())
    source.start()
    try:
        assert failed.wait(5)
    finally:
        source.stop()
    assert time.time() < first.expires  # the teardown still has a valid token
    assert source.current() == "t1"
    assert "trying again until the current token expires" in capsys.readouterr().err


def test_token_refused_names_the_status():
    assert "401 Unauthorized" in refused(401, "Unauthorized", "PATCH leases/x").message
    e = refused(403, 'pods is forbidden: User "u" cannot list', "listing the job's pods")
    assert e.exit_code == 3 and "403 Forbidden" in e.message and "cannot list" in e.message and e.hint


def test_api_outage_is_said_once_after_30s_and_again_when_it_ends():
    now = [0.0]
    out = io.StringIO()
    outage = ApiOutage("the job's pods", clock=lambda: now[0], stream=out)
    for t in (0, 10, 29):
        now[0] = t
        assert outage.failed(OSError("connection refused")) is None
    assert out.getvalue() == ""
    now[0] = 31
    outage.failed(OSError("connection refused"))
    now[0] = 40
    outage.failed(OSError("connection refused"))
    assert out.getvalue().count("warning: cannot read the job's pods for 31s (connection refused)") == 1
    outage.ok()
    assert "answers again" in out.getvalue()
