"""Waits that had no deadline, and a signal that could reach the wrong process (issue 49, lows).

- After SIGKILL mpilaunch waited for mpirun for ever (``runtime/procs.py``); a process stuck in the kernel
  outlives SIGKILL. Made real here with a frozen cgroup (v1 freezer: a frozen task keeps a pending
  SIGKILL until thawed, in state D), as root.
- A YARN container waited for ever for its agent's address file (``yarn/in_cluster/container.py``); the agent
  here is a stand-in that hangs before it listens (as on a hung filesystem).
- The stacks probe signalled a pid (``hang/probe.py``); here the pid really is reused, in a pid
  namespace of the test's own where ``ns_last_pid`` chooses the next pid, as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpilaunch.core import env_names
from mpilaunch.runtime import procs

REPO = Path(__file__).resolve().parents[3]
FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def frozen_cgroup():
    if os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 freezer")
    group = FREEZER / f"mpilaunch-test-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 10
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        group.rmdir()


def test_wait_after_sigkill_has_a_deadline(frozen_cgroup, monkeypatch, capfd):
    monkeypatch.setattr(procs, "KILL_WAIT_S", 1.0, raising=False)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (frozen_cgroup / "cgroup.procs").write_text(str(proc.pid))
    (frozen_cgroup / "freezer.state").write_text("FROZEN")
    result = []
    waiter = threading.Thread(target=lambda: result.append(procs.terminate_group(proc, grace=0.2)), daemon=True)
    started = time.monotonic()
    waiter.start()
    waiter.join(8)
    still_waiting = waiter.is_alive()
    elapsed = time.monotonic() - started
    (frozen_cgroup / "freezer.state").write_text("THAWED")  # now the SIGKILL lands
    waiter.join(10)
    proc.wait(10)
    assert not still_waiting, "terminate_group still waited for a process SIGKILL cannot end after 8 s"
    assert elapsed < 5, elapsed
    assert result == [-9]
    err = capfd.readouterr().err
    assert f"mpilaunch: warning: mpirun (pid {proc.pid}) is still there 1 s after SIGKILL (state D" in err


def test_yarn_agent_address_wait_has_a_deadline(tmp_path, monkeypatch):
    from mpilaunch.backends.yarn import tools
    from mpilaunch.backends.yarn.in_cluster import container

    stand_in = tmp_path / "tools"
    stand_in.mkdir()
    pidfile = tmp_path / "agent.pid"
    # the agent's interpreter stuck before it listens: it never writes the address file
    (stand_in / tools.RUNNER).write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
    )
    monkeypatch.setenv(env_names.TOOLS, str(stand_in))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(container, "AGENT_ADDRESS_TIMEOUT_S", 1.0, raising=False)
    outcome = []

    def start():
        try:
            outcome.append(container.start_agent("w0", b"secret", None, "container_1"))
        except SystemExit as e:
            outcome.append(e)

    waiter = threading.Thread(target=start, daemon=True)
    waiter.start()
    waiter.join(8)
    agent_pid = int(pidfile.read_text()) if pidfile.exists() else None
    try:
        assert not waiter.is_alive(), "the container still waits for its agent's address after 8 s"
        assert len(outcome) == 1 and isinstance(outcome[0], SystemExit), outcome
        assert "wrote no address in 1 s: stopped it" in str(outcome[0].code)
        assert agent_pid is not None and not os.path.exists(f"/proc/{agent_pid}"), "the stuck agent was left"
    finally:
        if agent_pid is not None and os.path.exists(f"/proc/{agent_pid}"):
            os.kill(agent_pid, 9)


# Run as pid 1 of a new pid namespace (its own /proc): the rank A the probe found exits, and B, armed
# the same way (mpilaunch's sitecustomize: a faulthandler on the stacks signal), gets A's pid.
REUSE = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from mpilaunch.hang import probe
env = dict(os.environ, PYTHONPATH=os.path.join(sys.argv[1], "mpilaunch", "hang", "site"))
program = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
def start():
    p = subprocess.Popen(program, env=env, stdout=subprocess.PIPE)
    p.stdout.readline()
    return p
def start_time(pid):
    return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[19]
a = start()
pid, a_start = a.pid, start_time(a.pid)
a.kill(); a.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(pid - 1))
b = start()
try:
    frames, why = probe.faulthandler_frames(pid, "S", 2.0, start=a_start)
except TypeError:  # a probe that takes no start time signals whatever holds the pid
    frames, why = probe.faulthandler_frames(pid, "S", 2.0)
# what a signal by pid alone does (the probe before): B gets it, and its stacks pass for A's
by_pid, _ = probe.faulthandler_frames(pid, "S", 2.0)
print(json.dumps({"reused": b.pid == pid, "frames": frames, "why": why, "by_pid": bool(by_pid),
                  "b_alive": b.poll() is None}))
b.kill()
"""


def test_stacks_signal_never_reaches_a_reused_pid():
    if os.geteuid() != 0:
        pytest.skip("makes a pid namespace and chooses its next pid: run as root")
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSE, str(REPO)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["reused"], seen  # the setup did reuse the pid
    assert seen["by_pid"], seen  # and a signal by pid reaches the new process
    assert seen["frames"] is None and "exited" in seen["why"], seen
    assert seen["b_alive"], seen
