"""Who an agent accepts, and how fast (issue 49 item 11).

- A network agent (YARN, ssh, Kubernetes ``--transport agent``) bounds the
  TLS handshakes one peer may start (a burst, then a rate): a peer that
  connects, sends a TLS hello and hangs up in a loop no longer keeps the
  agent's one thread doing handshakes.
- A local backend's agent listens on a Unix socket in the job's 0700 run
  directory and admits its own uid only (SO_PEERCRED). On loopback TCP,
  another local user shared 127.0.0.1's per-peer quota with the job's
  shims: 100 idle connections of theirs held up a launch.

The other user is the suite's ``mpilaunch-user`` (scripts/nonroot-user.sh),
running Debian's python3 on ``tests/programs/slowloris.py`` or a few lines
of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import psutil
import pytest

from support.agent import SECRET, AgentProc, tls_credential, wait_until
from support.helpers import PROGRAMS, leftover_processes, run_mpilaunch
from support.other_user import USER, other_user_alone, shared_sticky_dir

SLOWLORIS = PROGRAMS / "slowloris.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # the other user's: root's venv is out of its reach


@pytest.fixture
def other_user():
    """The unprivileged user's passwd entry, this test's alone."""
    if os.geteuid() != 0:
        pytest.skip("acts as another user: run as root")
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"the other user runs {SYSTEM_PYTHON}, which is missing")
    with other_user_alone(pytest.fail) as user:
        yield user


@pytest.fixture
def shared_tmp():
    with shared_sticky_dir("agent-accept-") as d:
        yield d


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def as_user(user, argv, **popen):
    """``argv`` run as ``user`` (runuser: no password, no login shell)."""
    return subprocess.Popen(["runuser", "-u", user.pw_name, "--", *argv], cwd="/", **popen)


# --- pure: the bucket and the addresses -----------------------------------------------------------


def test_agent_accept_rate_bucket_burst_refill_and_peers_apart():
    from mpilaunch.agent.handshake_limits import AcceptRate

    rate = AcceptRate(per_second=10.0, burst=3)
    assert [rate.take("a", 100.0) for _ in range(4)] == [True, True, True, False]
    assert rate.take("b", 100.0)  # another peer has a bucket of its own
    assert not rate.take("a", 100.05)  # half a token back: not yet
    assert rate.take("a", 100.15) and not rate.take("a", 100.15)  # one token a tenth of a second
    assert [rate.take("a", 200.0) for _ in range(4)] == [True, True, True, False]  # never above the burst
    for i in range(5000):  # many peers over time: the table forgets the full buckets
        rate.take(f"p{i}", 300.0 + i)
    assert len(rate.buckets) < 4200


def test_agent_accept_unix_addresses_round_trip():
    from mpilaunch.wire import protocol as P

    assert P.unix_sockaddr("unix:/run/x/agent-0.sock") == "/run/x/agent-0.sock"
    assert P.unix_sockaddr("unix:@name") == "\0name"
    assert P.unix_sockaddr("127.0.0.1:5") is None
    assert P.unix_address("/run/x/agent-0.sock") == "unix:/run/x/agent-0.sock"
    assert P.unix_address(b"\0name") == "unix:@name"
    for bad in ("unix:", "unix:/a\0b"):
        with pytest.raises(ValueError):
            P.unix_sockaddr(bad)


# --- network agents: the handshakes one peer may start -------------------------------------------


def tls_hello_answered(address: tuple[str, int], source: str) -> str:
    """Connect from ``source``, send a TLS ClientHello, hang up once answered: ``tls`` (the agent did a
    handshake's work: its ServerHello came), ``busy`` (refused in clear) or ``closed``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing)
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(address)
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        sock.sendall(outgoing.read())
        data = b""
        while len(data) < 5:
            try:
                chunk = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                chunk = b""
            if not chunk:
                return "closed"
            data += chunk
        if data[:1] == b"\x16":  # a TLS handshake record: the agent's ServerHello
            return "tls"
        return "busy"


def test_agent_accept_rate_bounds_the_tls_handshakes_one_peer_starts(tmp_path):
    """300 connect-hello-hang-up rounds from one peer, as fast as it goes: the agent does the work of
    at most its burst plus its rate's share of TLS handshakes, answers the rest busy in clear, and a
    client on another address runs a command meanwhile."""
    from mpilaunch.agent.constants import PEER_ACCEPT_BURST, PEER_ACCEPTS_PER_SECOND

    agent = AgentProc(tmp_path, secret=tls_credential())
    try:
        host, port = agent.address.rsplit(":", 1)
        counts = {"tls": 0, "busy": 0, "closed": 0}
        start = time.monotonic()
        for _ in range(300):
            counts[tls_hello_answered((host, int(port)), "127.0.0.9")] += 1
        elapsed = time.monotonic() - start
        assert agent.run("echo ok", connect_timeout=10)[:2] == (0, b"ok\n")  # from 127.0.0.1
    finally:
        agent.stop()
    allowed = PEER_ACCEPT_BURST + PEER_ACCEPTS_PER_SECOND * elapsed + 2
    assert counts["tls"] <= allowed, f"{counts} in {elapsed:.2f} s: more handshakes than {allowed:.0f}"
    assert counts["tls"] >= PEER_ACCEPT_BURST, counts  # the burst gets through
    assert counts["busy"] >= 300 - allowed - counts["closed"], counts
    log = agent.log()
    assert "too many connections from this peer" in log
    assert len([line for line in log.splitlines() if "127.0.0.9" in line]) < 10  # the log stays quiet


# --- local agents: a Unix socket of the owner's alone ----------------------------------------------

CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
    data = s.recv(64)
except OSError as e:
    print("error", type(e).__name__)
else:
    print("data" if data else "closed")
"""


def test_agent_accept_unix_socket_refuses_another_uid(other_user, shared_tmp, tmp_path):
    """An agent serving a Unix socket whose file anyone may open (here on purpose: the local backend's
    sits in a 0700 directory) admits its own uid and turns another away before a byte is sent."""
    path = shared_tmp / "agent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    path.chmod(0o777)
    agent = AgentProc(
        tmp_path / "agent",
        args=["--listen-fd", str(listener.fileno())],
        popen={"pass_fds": (listener.fileno(),)},
    )
    listener.close()
    try:
        address = f"unix:{path}"
        other = as_user(other_user, [SYSTEM_PYTHON, "-c", CONNECT, str(path)], stdout=subprocess.PIPE, text=True)
        out, _ = other.communicate(timeout=30)
        from mpilaunch.rsh_agent import agent_client

        mine = agent_client.run_capture(address, SECRET, "echo mine", timeout=20)
    finally:
        agent.stop()
    assert out.split() == ["closed"], f"the other user's connection: {out!r}\n{agent.log()}"
    assert mine[:2] == (0, b"mine\n"), (mine, agent.log())
    assert f"(uid {other_user.pw_uid}): only uid 0 may connect" in agent.log()


def test_agent_accept_local_agents_listen_in_the_private_run_directory(other_user, tmp_path):
    """The local backend's agents: each a Unix socket, mode 0600, in the job's 0700 run directory; the
    other user cannot even connect."""
    from mpilaunch.backends.local.backend import UNIX_PATH_MAX, agent_socket_address, listening_socket
    from mpilaunch.runtime.rundir import make_rundir

    rundir = make_rundir("accept-probe")
    try:
        address = agent_socket_address(rundir, 3)
        assert address == f"unix:{rundir}/agent-3.sock"
        with listening_socket(address):
            path = address[len("unix:") :]
            assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
            assert oct(os.stat(rundir).st_mode & 0o777) == oct(0o700)
            other = as_user(other_user, [SYSTEM_PYTHON, "-c", CONNECT, path], stdout=subprocess.PIPE, text=True)
            out, _ = other.communicate(timeout=30)
        assert out.split() == ["error", "PermissionError"], out
        deep = tmp_path / ("d" * (UNIX_PATH_MAX - len(str(tmp_path))))
        assert agent_socket_address(deep, 0).startswith("unix:@mpilaunch-agent-")  # too long a path
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


@pytest.mark.mpi
def test_agent_accept_flood_from_another_user_does_not_hold_up_a_local_launch(
    openmpi5, other_user, shared_tmp, tmp_path
):
    """A real local launch, timed alone and then while another user holds 100 idle connections to each
    of its agents (started by a wrapper mpirun from the moment the agents' addresses are known, from
    127.0.0.1 where they are TCP). The attacked launch takes no longer than the quiet one, give or take."""
    ready, stats_file, pidfile = shared_tmp / "flood.ready", shared_tmp / "flood.json", tmp_path / "pid"
    wrapper = tmp_path / "mpirun"
    wrapper.write_text(f"""#!{sys.executable}
import json, os, subprocess, sys, time
real = {openmpi5.mpirun!r}
context = os.environ.get("MPILAUNCH_CONTEXT")
if os.environ.get("FLOOD") and context and os.path.exists(context):
    addresses = [w["address"] for w in json.load(open(context))["workers"].values()]
    p = subprocess.Popen(["runuser", "-u", {USER!r}, "--", {SYSTEM_PYTHON!r}, {str(SLOWLORIS)!r},
                          "--source", "127.0.0.1", "--per-target", "100", "--ready", {str(ready)!r},
                          "--stats", {str(stats_file)!r}, *addresses], start_new_session=True, cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open({str(pidfile)!r}, "w").write(str(p.pid))
    deadline = time.monotonic() + 30
    while not os.path.exists({str(ready)!r}) and time.monotonic() < deadline:
        time.sleep(0.02)
if os.environ.get("EXEC_TIMES"):  # mpirun's own start (not its --version): the flood's start-up is not timed
    with open(os.environ["EXEC_TIMES"], "a") as f:
        f.write(repr(time.time()) + " ")
os.execv(real, [real] + sys.argv[1:])
""")
    wrapper.chmod(0o755)
    install = type(openmpi5)(openmpi5.id, str(wrapper), openmpi5.pythonpath, openmpi5.library)
    name = "accept-flood"
    args = ["--name", name, "--np", "4", "--slots-per-worker", "2", "--timeout", "90", "-q", "--"]
    args += [sys.executable, "tests/programs/placement.py"]

    def launch(flood: bool):
        """The run, and how long from mpirun's start to mpilaunch's end (every shim, every rank)."""
        times = tmp_path / f"exec-{flood}"
        env = {"EXEC_TIMES": str(times), **({"FLOOD": "1"} if flood else {})}
        proc = run_mpilaunch(args, install, env_extra=env, timeout=150)
        ended = time.time()
        started = float(times.read_text().split()[0]) if times.exists() else ended
        return proc, ended - started

    quiet, quiet_s = launch(False)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    try:
        attacked, attacked_s = launch(True)
    finally:
        if pidfile.exists():
            flood = int(pidfile.read_text())
            try:
                os.killpg(flood, signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_until(lambda: gone(flood), 15)
    print(f"from mpirun's start: alone {quiet_s:.2f} s, under 100 idle connections per agent {attacked_s:.2f} s")
    assert ready.exists(), "the flood never started: " + attacked.stderr
    assert attacked.returncode == 0, attacked.stdout + attacked.stderr
    ranks = [json.loads(line[line.find("{") :]) for line in attacked.stdout.splitlines() if '"rank"' in line]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    assert attacked_s < quiet_s + 1.5, f"alone {quiet_s:.2f} s, attacked {attacked_s:.2f} s"
    assert wait_until(lambda: stats_file.exists() and json.loads(stats_file.read_text()), 10)
    time.sleep(0.5)  # its final stats after SIGTERM
    stats = json.loads(stats_file.read_text())
    assert len(stats) == 2, stats
    for address, s in stats.items():
        assert s["max_held"] == 0 and s["refused"] > 0, (address, s)  # it never got a connection in
    assert leftover_processes(name) == []
