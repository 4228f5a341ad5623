"""An API-server outage is no silence of mpilaunch's (issue 49, item 3).

A reaper that could not read the heartbeat for longer than ``--orphan-timeout``
(a control-plane upgrade, an API server that refuses connections or hangs)
used to count the outage as silence, so its first good read afterwards, with
the renewal not landed yet, deleted a live job. Here the reapers' own loops
(k8s ``reap``, YARN's driver) run against a scripted API and a scripted
clock: nothing sleeps, every read happens at a known time. The real SIGKILL
tests (``-k sigkill``) prove the other half on the testbeds.
"""

from __future__ import annotations

import socket
import sys
import types

import pytest

from mpilaunch.backends.k8s import orphan as k8s_orphan
from mpilaunch.backends.k8s.api import ApiError
from mpilaunch.backends.k8s.credentials import CredentialError
from mpilaunch.backends.yarn.in_cluster import driver
from mpilaunch.core import orphan as rules

TIMEOUT = 10.0  # --orphan-timeout; the reaper polls every 2 s, the host renews every 2.5 s
POLL = rules.poll_interval(TIMEOUT)
OUTAGE = 40.0  # four timeouts


class Clock:
    """A monotonic clock that moves only when the reaper sleeps or a scripted read takes time."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Finished(BaseException):
    """The script ran out: the job ended by itself (a BaseException: the loops retry every Exception)."""


def refused():
    raise ConnectionRefusedError(111, "Connection refused")


class Script:
    """The heartbeat as the reaper reads it, by the reaper's clock.

    ``renewals``: (time, value) the host's renewals land at; ``down``: (start, end) intervals
    during which the API server answers ``down_as`` (refuses, hangs until the client's timeout, or
    holds the read and answers it when it comes back); ``until``: when the job ends by itself.
    """

    def __init__(self, clock, renewals, down=(), down_as="refused", until=None):
        self.clock, self.renewals, self.down, self.down_as, self.until = clock, renewals, down, down_as, until
        self.reads = []  # (time, what the read got)

    def value(self):
        t = self.clock()
        landed = [v for at, v in self.renewals if at <= t]
        return landed[-1] if landed else None

    def outage_end(self):
        t = self.clock()
        return next((end for start, end in self.down if start <= t < end), None)

    def read(self):
        if self.until is not None and self.clock() >= self.until:
            raise Finished
        end = self.outage_end()
        if end is not None:
            if self.down_as == "refused":
                self.reads.append((self.clock(), "refused"))
                refused()
            if self.down_as == "unresponsive":  # the client gives up after 30 s (Api's timeout)
                self.clock.sleep(min(30.0, end - self.clock()))
                if self.clock() < end:
                    self.reads.append((self.clock(), "timed out"))
                    raise socket.timeout("timed out")
            elif self.down_as == "held":  # the read waits; it is answered when the server comes back
                self.clock.sleep(end - self.clock())
            else:
                self.reads.append((self.clock(), self.down_as))
                raise self.down_as
        value = self.value()
        self.reads.append((self.clock(), value))
        return value


def renewals_every(interval, start, end):
    n = int((end - start) / interval) + 1
    return [(start + i * interval, f"renewed at {start + i * interval:.1f}") for i in range(n)]


def live_job_through_an_outage(clock, down_as, *, renewal_lands_after=1.0):
    """A live job, renewing every 2.5 s, through a 40 s outage that begins at +20 s; the host's first
    renewal after the outage lands ``renewal_lands_after`` seconds after the reaper's first good read
    (it was queued behind the reaper's read, or the host's heartbeat is mid-interval)."""
    t0 = clock()
    out_start, out_end = t0 + 20.0, t0 + 20.0 + OUTAGE
    before = [r for r in renewals_every(2.5, t0, out_start) if r[0] < out_start]
    after = renewals_every(2.5, out_end + POLL + renewal_lands_after, t0 + 200.0)
    return Script(clock, before + after, down=[(out_start, out_end)], down_as=down_as, until=t0 + 200.0)


class LeaseApi:
    """The k8s API as the reaper sees it: the Lease (from a Script) and the root ConfigMap's delete."""

    def __init__(self, script: Script):
        self.script = script
        self.deleted = []

    def get(self, api_version, plural, name):
        assert (api_version, plural) == (k8s_orphan.LEASE_API, "leases")
        try:
            renew_time = self.script.read()
        except Finished:
            raise ApiError(404, "NotFound", f'leases "{name}" not found') from None
        return {
            "metadata": {"name": name, "ownerReferences": [{"kind": "ConfigMap", "name": name, "uid": "u-1"}]},
            "spec": {"holderIdentity": "mpilaunch@test", "renewTime": renew_time},
        }

    def delete(self, api_version, plural, name, **body):
        self.deleted.append((self.script.clock(), plural, name, body))


def k8s_reap(script: Script, clock: Clock, deadline_s=None):
    api = LeaseApi(script)
    logged = []
    reason = k8s_orphan.reap(api, "job", TIMEOUT, deadline_s, log=logged.append, clock=clock, sleep=clock.sleep)
    return reason, api.deleted, logged


DOWN_AS = ["refused", "unresponsive", "held", ApiError(503, "ServiceUnavailable", "etcd is being upgraded")]
DOWN_IDS = ["refused", "unresponsive", "held", "503"]


# --- the pure rules -------------------------------------------------------------------------------


def test_reaper_outage_first_good_read_after_failures_with_an_unchanged_renewal_is_no_silence():
    """The issue's case on the rules alone: reads fail for 40 s, then the first good read still sees the
    renewal from before the outage. Before the fix this was 'no heartbeat for 42s': the job went."""
    seen = rules.observe(None, "r1", now=0.0)
    seen = rules.observe(seen, "r1", now=2.0)
    for t in range(4, 44, 2):
        seen = rules.unread(seen)
        assert seen.blind
    seen = rules.observe(seen, "r1", now=44.0, asked=44.0)
    assert not rules.judge(seen, 44.0, TIMEOUT).end
    assert seen.silent == 2.0  # only the 2 s seen before the outage
    # a renewal landing later keeps it alive; one that never comes ends it after the timeout *seen*
    assert rules.observe(seen, "r2", now=46.0).silent == 0.0
    for t in (46.0, 48.0, 50.0):
        seen = rules.observe(seen, "r1", now=t)
        assert not rules.judge(seen, t, TIMEOUT).end
    seen = rules.observe(seen, "r1", now=52.0)
    assert rules.judge(seen, 52.0, TIMEOUT).end  # 2 + 8 = 10 s of silence seen


def test_reaper_outage_a_read_that_hangs_counts_no_silence_while_it_hangs():
    """An unresponsive API server that answers the read when it comes back (SIGSTOP, then SIGCONT)."""
    seen = rules.observe(None, "r1", now=0.0)
    seen = rules.observe(seen, "r1", now=2.0 + 80.0, asked=2.0)  # sent at 2 s, answered 80 s later
    assert seen.silent == 2.0 and not rules.judge(seen, 82.0, TIMEOUT).end


def test_reaper_outage_unread_before_any_good_read_leaves_the_first_reading_fresh():
    assert rules.unread(None) is None
    assert rules.observe(rules.unread(None), "r1", now=500.0).silent == 0.0


# --- the k8s reaper's loop ------------------------------------------------------------------------


@pytest.mark.parametrize("down_as", DOWN_AS, ids=DOWN_IDS)
def test_reaper_outage_k8s_live_job_survives_an_api_server_outage_longer_than_the_timeout(down_as):
    clock = Clock()
    script = live_job_through_an_outage(clock, down_as)
    reason, deleted, logged = k8s_reap(script, clock)
    assert deleted == [] and reason is None, f"reaped a live job: {reason}\nreads: {script.reads}"
    if down_as != "held":
        assert any("retrying" in line for line in logged)  # it did see the outage


def test_reaper_outage_k8s_credential_errors_during_an_outage_are_no_silence_either():
    clock = Clock()
    script = live_job_through_an_outage(clock, CredentialError("the API server refused the token (401)"))
    reason, deleted, _ = k8s_reap(script, clock)
    assert deleted == [] and reason is None, reason


@pytest.mark.parametrize("down_as", DOWN_AS, ids=DOWN_IDS)
def test_reaper_outage_k8s_still_reaps_a_submitter_that_died_before_the_outage(down_as):
    """mpilaunch SIGKILLed at +15 s, the API server down from +20 s to +60 s: the job is deleted once
    the reaper has seen the Lease unchanged for the timeout, counting the seconds on both sides."""
    clock = Clock()
    t0 = clock()
    died = t0 + 15.0
    script = Script(
        clock,
        [r for r in renewals_every(2.5, t0, died) if r[0] <= died],
        down=[(t0 + 20.0, t0 + 60.0)],
        down_as=down_as,
    )
    reason, deleted, _ = k8s_reap(script, clock)
    assert reason and reason.startswith("no heartbeat from the submitting mpilaunch for 10s")
    [(at, plural, name, body)] = deleted
    assert (plural, name, body["preconditions"]) == ("configmaps", "job", {"uid": "u-1"})
    seen_before = (t0 + 20.0) - (t0 + 15.0)  # at most this much was seen before the outage
    # deleted after the timeout of silence seen, never later than one poll (and one hung read) past it
    assert t0 + 60.0 + TIMEOUT - seen_before - POLL <= at <= t0 + 60.0 + 30.0 + TIMEOUT + POLL, script.reads


def test_reaper_outage_k8s_still_reaps_a_submitter_that_died_during_the_outage():
    clock = Clock()
    t0 = clock()
    renewals = [r for r in renewals_every(2.5, t0, t0 + 20.0) if r[0] < t0 + 20.0]  # none land after +20 s
    script = Script(clock, renewals, down=[(t0 + 20.0, t0 + 60.0)], down_as="refused")
    reason, [(at, *_)], _ = k8s_reap(script, clock)
    assert reason.startswith("no heartbeat")
    assert t0 + 60.0 + TIMEOUT - 2.5 - POLL <= at <= t0 + 60.0 + TIMEOUT + POLL


def test_reaper_outage_k8s_still_reaps_a_dead_submitter_behind_a_flapping_api_server():
    """Every third read fails, for ever: the silence between good reads still adds up (a rule that
    restarted the count at every failure would never end this job)."""
    clock = Clock()
    t0 = clock()
    flaps = [(t0 + 4.0 + 6.0 * i, t0 + 4.0 + 6.0 * i + 1.0) for i in range(200)]
    script = Script(clock, [(t0, "only renewal")], down=flaps, down_as="refused")
    reason, [(at, *_)], _ = k8s_reap(script, clock)
    assert reason.startswith("no heartbeat")
    assert at <= t0 + 3 * TIMEOUT, script.reads


def test_reaper_outage_k8s_without_an_outage_reaps_at_the_timeout():
    clock = Clock()
    t0 = clock()
    script = Script(clock, [(t0, "only renewal")])
    reason, [(at, *_)], _ = k8s_reap(script, clock)
    assert reason.startswith("no heartbeat") and at == t0 + TIMEOUT


def test_reaper_outage_k8s_deadline_still_ends_a_live_job_after_an_outage():
    clock = Clock()
    script = live_job_through_an_outage(clock, "refused")
    reason, deleted, _ = k8s_reap(script, clock, deadline_s=90.0)
    assert "cluster-side deadline" in reason and len(deleted) == 1
    assert deleted[0][0] >= 1000.0 + 90.0


# --- YARN's driver --------------------------------------------------------------------------------


def run_driver(monkeypatch, script: Script, clock: Clock, deadline_s=None):
    """``driver.main`` as skein runs it in the ApplicationMaster, against a fake skein and the scripted clock."""
    shutdowns = []

    class Kv:
        def get(self, key):
            assert key == "mpilaunch/heartbeat"
            return script.read()

    class ApplicationClient:
        kv = Kv()

        @classmethod
        def from_current(cls):
            return cls()

        def shutdown(self, status, diagnostics=None):
            shutdowns.append((clock(), status, diagnostics))

    monkeypatch.setitem(sys.modules, "skein", types.SimpleNamespace(ApplicationClient=ApplicationClient))
    monkeypatch.setattr(
        driver, "time", types.SimpleNamespace(monotonic=clock, sleep=clock.sleep, strftime=lambda f: "t")
    )
    monkeypatch.setenv("MPILAUNCH_ORPHAN_TIMEOUT", f"{TIMEOUT:g}")
    monkeypatch.delenv("MPILAUNCH_YARN_KV", raising=False)
    if deadline_s is None:
        monkeypatch.delenv("MPILAUNCH_DEADLINE_S", raising=False)
    else:
        monkeypatch.setenv("MPILAUNCH_DEADLINE_S", str(deadline_s))
    try:
        rc = driver.main()
    except Finished:  # the application ended by itself: skein stopped the driver
        rc = None
    return rc, shutdowns


@pytest.mark.parametrize("down_as", ["refused", "unresponsive", "held"])
def test_reaper_outage_yarn_live_job_survives_an_application_master_outage(monkeypatch, down_as):
    clock = Clock()
    script = live_job_through_an_outage(clock, down_as)
    rc, shutdowns = run_driver(monkeypatch, script, clock)
    assert shutdowns == [] and rc is None, f"ended a live application: {shutdowns}\nreads: {script.reads}"


@pytest.mark.parametrize("outage", [False, True], ids=["no-outage", "outage"])
def test_reaper_outage_yarn_kills_an_application_whose_submitter_died(monkeypatch, outage):
    clock = Clock()
    t0 = clock()
    down = [(t0 + 20.0, t0 + 60.0)] if outage else []
    script = Script(clock, [r for r in renewals_every(2.5, t0, t0 + 15.0)], down=down, down_as="refused")
    rc, [(at, status, diagnostics)] = run_driver(monkeypatch, script, clock)
    assert rc == 0 and status == "KILLED"
    assert diagnostics.startswith("mpilaunch: no heartbeat from the submitting mpilaunch for 10s")
    if outage:
        assert t0 + 60.0 + TIMEOUT - 5.0 - POLL <= at <= t0 + 60.0 + TIMEOUT + POLL
    else:
        assert t0 + 15.0 + TIMEOUT <= at <= t0 + 15.0 + TIMEOUT + POLL


def test_reaper_outage_yarn_deadline_fails_the_application_after_an_outage(monkeypatch):
    clock = Clock()
    script = live_job_through_an_outage(clock, "refused")
    rc, [(at, status, diagnostics)] = run_driver(monkeypatch, script, clock, deadline_s=90)
    assert rc == 0 and status == "FAILED" and "cluster-side deadline" in diagnostics
    assert at >= 1000.0 + 90.0
