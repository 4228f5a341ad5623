"""The exec agent against hostile peers: tampered, injected and replayed frames
(an on-path attacker between an authenticated client and its agent), and a
slowloris peer holding idle connections (issue 24 item 6).

The attacker is real: a TCP proxy that rewrites frames in flight, and
``tests/programs/slowloris.py`` bound to 127.0.0.9 (every 127.x address is
local on Linux, so the agent on 127.0.0.1 sees it as another host than the
client). "Nothing ran" is proven with commands that would create a marker.
A local launch under attack is ``test_agent_accept.py``'s: the local
backend's agents listen on Unix sockets of the job's user alone since issue
49, out of reach of another address or user.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mpilaunch.agent.handshake_limits import PendingLimits, QuietNotes, peer_key
from mpilaunch.rsh_agent import agent_client
from mpilaunch.wire import protocol as P
from support.agent import SECRET, AgentProc, agent_env, wait_until
from support.helpers import PROGRAMS, REPO

SLOWLORIS = PROGRAMS / "slowloris.py"
ATTACKER_IP = "127.0.0.9"


@pytest.fixture
def agent(tmp_path):
    a = AgentProc(tmp_path)
    yield a
    a.stop()


# --- pure: the frame channel and the admission rules ----------------------------------------


def channels():
    key = os.urandom(32)
    return P.Channel(key, P.CLIENT), P.Channel(key, P.AGENT)


def test_tampered_replayed_reordered_dropped_and_reflected_frames_fail_authentication():
    client, agent = channels()
    run = client.frame(P.RUN, P.encode_run("echo hi"))
    assert agent.pop_frames(bytearray(run), P.CLIENT_TYPES) == [(P.RUN, P.encode_run("echo hi"))]
    stdin_a, stdin_b = client.frame(P.STDIN, b"a"), client.frame(P.STDIN, b"b")
    flipped = bytearray(stdin_a)
    flipped[P.HEADER_LEN] ^= 0x01  # "a" -> "`"
    attacks = {
        "tampered payload": bytes(flipped),
        "replayed": run,
        "out of order": stdin_b,
        "injected under another key": P.Channel(os.urandom(32), P.CLIENT).frame(P.STDIN, b"a"),
        "tag missing its last byte, then one from the next frame": stdin_a[:-1] + stdin_b[:1],
    }
    for what, data in attacks.items():
        with pytest.raises(P.ProtocolError, match="failed authentication"):
            agent.pop_frames(bytearray(data), P.CLIENT_TYPES)
        assert agent.received == 1, what  # nothing of it was accepted
    # A valid frame after a rejected batch still needs the right sequence number.
    assert agent.pop_frames(bytearray(stdin_a + stdin_b), P.CLIENT_TYPES) == [(P.STDIN, b"a"), (P.STDIN, b"b")]
    # A frame that fails rejects the whole batch: the valid one before it is not returned either.
    good, bad = client.frame(P.STDIN, b"c"), bytearray(client.frame(P.STDIN, b"d"))
    bad[-1] ^= 0xFF
    with pytest.raises(P.ProtocolError):
        agent.pop_frames(bytearray(good + bytes(bad)), P.CLIENT_TYPES)
    # Reflected: a side's own frame, same key and sequence number, sent back to it.
    client, agent = channels()
    with pytest.raises(P.ProtocolError, match="failed authentication"):
        agent.pop_frames(bytearray(agent.frame(P.STDIN, b"a")), P.CLIENT_TYPES)


def test_session_keys_differ_for_every_handshake_and_secret():
    sn, cn = P.new_nonce(), P.new_nonce()
    key = P.session_key(SECRET, sn, cn)
    assert key != P.session_key(SECRET, P.new_nonce(), cn)
    assert key != P.session_key(SECRET, sn, P.new_nonce())
    assert key != P.session_key(b"other", sn, cn)
    # Neither proof that crosses the wire is the key.
    assert key not in (P.client_proof(SECRET, sn, cn), P.server_proof(SECRET, sn, cn))


def test_peer_keys_and_pending_limits():
    assert peer_key("10.1.2.3") == "10.1.2.3"
    assert peer_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    limits = PendingLimits(per_peer=2, total=3)
    assert limits.admit("a") is None and limits.admit("a") is None
    assert "from this peer" in limits.admit("a")
    assert limits.admit("b") is None
    assert "limit 3" in limits.admit("c")  # the global cap
    limits.release("a")
    assert limits.admit("c") is None
    notes = QuietNotes(interval=10)
    assert notes.note("p", "busy", "refused", now=0) == "refused"
    assert notes.note("p", "busy", "refused", now=1) is None
    assert notes.note("p", "timeout", "timed out", now=1) == "timed out"  # another reason is its own line
    assert notes.note("p", "busy", "refused", now=11) == "refused (1 more like it since the last note)"


# --- a man in the middle ------------------------------------------------------------------------


class TamperingProxy:
    """Relays client <-> agent, passing the handshake through untouched, then hands each
    frame to ``upstream(i, frame)`` (client -> agent) or ``downstream(i, frame)``, which
    return the bytes to forward instead.  ``frames`` records what the client sent."""

    def __init__(self, agent_address, upstream=None, downstream=None):
        self.target = P.parse_address(agent_address)
        self.upstream, self.downstream = upstream, downstream
        self.frames = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            agent = socket.create_connection(self.target)
            for src, dst, skip, mutate, record in (
                (client, agent, P.CLIENT_HELLO_LEN, self.upstream, self.frames),
                (agent, client, P.SERVER_HELLO_LEN + P.MAC_LEN, self.downstream, None),
            ):
                threading.Thread(target=self._pump, args=(src, dst, skip, mutate, record), daemon=True).start()

    @staticmethod
    def _pump(src, dst, skip, mutate, record):
        buf, index = b"", 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                if skip:
                    n = min(skip, len(buf))
                    dst.sendall(buf[:n])
                    buf, skip = buf[n:], skip - n
                while len(buf) >= P.HEADER_LEN:
                    total = P.HEADER_LEN + int.from_bytes(buf[1:5], "big") + P.MAC_LEN
                    if len(buf) < total:
                        break
                    frame, buf = buf[:total], buf[total:]
                    if record is not None:
                        record.append(frame)
                    dst.sendall(mutate(index, frame) if mutate else frame)
                    index += 1
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()


def assert_still_serving_and_ran_nothing(agent, *markers):
    time.sleep(0.3)
    for marker in markers:
        assert not marker.exists(), f"{marker.name} was created: the forged command ran"
    assert agent.run("echo still serving")[:2] == (0, b"still serving\n")
    assert agent.proc.poll() is None


def test_tampered_run_frame_runs_nothing(agent, tmp_path):
    """The classic injection: the client asks for one command, the attacker rewrites it in flight."""
    wanted, injected = tmp_path / "ran-wanted", tmp_path / "ran-INJECT"
    swap = lambda i, frame: frame.replace(b"ran-wanted", b"ran-INJECT") if i == 0 else frame  # noqa: E731
    proxy = TamperingProxy(agent.address, upstream=swap)
    try:
        with pytest.raises(agent_client.AgentError):
            agent_client.run_command(proxy.address, SECRET, f"touch {wanted}", timeout=10)
    finally:
        proxy.close()
    assert_still_serving_and_ran_nothing(agent, wanted, injected)
    log = agent.log()
    assert "frame failed authentication" in log
    assert log.count("start pid=") == 1  # only the check above ran


def assert_first_frame_swapped_runs_nothing(agent, frame: bytes, marker) -> None:
    """A session whose first frame (the client's RUN of ``true``) a proxy replaces by ``frame``
    fails, and ``frame``'s command (it would create ``marker``) did not run."""
    proxy = TamperingProxy(agent.address, upstream=lambda i, sent: frame if i == 0 else sent)
    try:
        with pytest.raises(agent_client.AgentError):
            agent_client.run_command(proxy.address, SECRET, "true", timeout=10)
    finally:
        proxy.close()
    assert_still_serving_and_ran_nothing(agent, marker)


def test_tampered_forged_run_frame_under_a_guessed_key_runs_nothing(agent, tmp_path):
    """An attacker who hijacks the connection after the handshake and sends its own RUN."""
    marker = tmp_path / "forged"
    forged = P.Channel(os.urandom(32), P.CLIENT).frame(P.RUN, P.encode_run(f"touch {marker}"))
    assert_first_frame_swapped_runs_nothing(agent, forged, marker)


def test_tampered_replay_of_another_sessions_run_frame_runs_nothing(agent, tmp_path):
    marker = tmp_path / "replayed"
    recorder = TamperingProxy(agent.address)
    try:
        assert agent_client.run_command(recorder.address, SECRET, f"touch {marker}", timeout=10) == 0
    finally:
        recorder.close()
    assert marker.exists()  # the genuine session ran
    marker.unlink()
    assert_first_frame_swapped_runs_nothing(agent, recorder.frames[0], marker)


def test_tampered_replayed_stdin_frame_ends_the_running_session(agent, tmp_path):
    """A frame replayed inside a running session: the session ends, the frame is not delivered."""
    out = tmp_path / "out"
    replay = lambda i, frame: frame + frame if i == 1 else frame  # noqa: E731  (frame 1: the first STDIN)
    proxy = TamperingProxy(agent.address, upstream=replay)
    r, w = os.pipe()
    try:
        os.write(w, b"x\n")
        with pytest.raises(agent_client.AgentError):
            agent_client.run_command(
                proxy.address, SECRET, f'read a && read b && echo "$a$b" > {out}', stdin=r, timeout=10
            )
    finally:
        os.close(w)
        os.close(r)
        proxy.close()
    # Only a second "x" completes both reads; the first one may arrive before the replay is seen.
    assert_still_serving_and_ran_nothing(agent, out)
    assert wait_until(lambda: "reason=protocol error: frame failed authentication" in agent.log(), 5), agent.log()


def test_tampered_exit_frame_is_refused_by_the_client(agent):
    """The other direction: a forged exit status must not become the shim's (mpirun's) verdict."""

    def zero_exit(i, frame):
        if frame[0] == P.EXIT:
            return frame[: P.HEADER_LEN] + P.encode_int(0) + frame[P.HEADER_LEN + 4 :]
        return frame

    proxy = TamperingProxy(agent.address, downstream=zero_exit)
    try:
        with pytest.raises(agent_client.AgentError, match="failed authentication"):
            agent_client.run_command(proxy.address, SECRET, "exit 3", timeout=10)
    finally:
        proxy.close()


# --- slowloris --------------------------------------------------------------------------------------


def start_slowloris(tmp_path: Path, addresses, per_target=1024):
    ready, stats = tmp_path / "slowloris.ready", tmp_path / "slowloris.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SLOWLORIS),
            "--source",
            ATTACKER_IP,
            "--per-target",
            str(per_target),
            "--ready",
            str(ready),
            "--stats",
            str(stats),
            *addresses,
        ],
        env=agent_env(),
        cwd=REPO,
        start_new_session=True,
    )
    assert wait_until(ready.exists, 30), "the slowloris peer did not get ready"
    return proc, stats


def stop_slowloris(proc, stats: Path) -> dict:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return json.loads(stats.read_text())


def test_slowloris_peer_does_not_lock_out_other_peers(agent, tmp_path):
    attacker, stats_file = start_slowloris(tmp_path, [agent.address])
    try:
        start = time.monotonic()
        for i in range(5):
            assert agent.run(f"echo {i}", connect_timeout=10)[:2] == (0, f"{i}\n".encode())
            assert agent_client.ping(agent.address, SECRET, 5)
        elapsed = time.monotonic() - start
        time.sleep(4.0)  # past the handshake deadline: the attacker's held slots were dropped
        assert agent.run("echo after", connect_timeout=10)[:2] == (0, b"after\n")
    finally:
        stats = stop_slowloris(attacker, stats_file)[agent.address]
    assert elapsed < 10, f"5 runs and pings took {elapsed:.1f} s under the attack"
    assert 1 <= stats["max_held"] <= 32, stats  # it reached the agent, and held no more than its share
    assert stats["busy"] >= 900, stats  # the rest of its 1024 was turned away at once
    assert stats["dropped"] >= 32, stats  # held ones end at the 3 s handshake deadline
    log = agent.log()
    assert "too many connections waiting to authenticate from this peer" in log
    assert "handshake timed out" in log
    attacker_lines = [ln for ln in log.splitlines() if ATTACKER_IP in ln]
    assert len(attacker_lines) < 20, f"{len(attacker_lines)} log lines about the attacker"


def test_burst_above_the_per_peer_limit_is_retried_not_failed(tmp_path):
    """Clients on one host share its limit: over it they are told busy and retry."""
    agent = AgentProc(tmp_path, args=["--handshake-timeout", "30"])  # the idle ones below stay until closed
    port = int(agent.address.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
    try:
        for s in idle:  # each was accepted and greeted: the limit is full
            s.settimeout(5)
            assert len(s.recv(P.SERVER_HELLO_LEN)) == P.SERVER_HELLO_LEN
        with pytest.raises(agent_client.AgentError, match="stayed busy"):
            agent.run("true", connect_timeout=1)
        threading.Timer(0.5, lambda: [s.close() for s in idle]).start()
        start = time.monotonic()
        assert agent.run("echo in", connect_timeout=10)[:2] == (0, b"in\n")
        assert time.monotonic() - start >= 0.4  # it waited for a slot
        with ThreadPoolExecutor(128) as pool:  # a burst far over the limit: every one gets through
            assert all(pool.map(lambda _: agent_client.ping(agent.address, SECRET, 10), range(128)))
        assert "from this peer" in agent.log()
    finally:
        for s in idle:
            s.close()
        agent.stop()
