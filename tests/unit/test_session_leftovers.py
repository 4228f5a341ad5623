"""What is left of mpirun's session after a broken run (runtime/procs.py kill_session_leftovers): Open
MPI's mpirun puts each rsh agent it starts in a process group of its own, so killing mpirun's
group missed them, and a surviving worker's shim held mpirun's pipes (and a relaunch onto a
spare) until its daemon noticed. Real processes here: a session leader whose child leaves its
group, as mpirun's rsh agents do."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from mpilaunch.runtime.procs import end_leftover_group, kill_session_leftovers, session_members

# the leader starts a child in a group of its own (setpgid, as Open MPI does for its rsh agents),
# says the child's pid, then ends; the child holds the leader's stdout open
LEADER = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=lambda: os.setpgid(0, 0))
print(child.pid, flush=True)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_broken_run_leftovers_in_groups_of_their_own_are_killed_by_session():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(leader.stdout.readline())
    leader.wait(timeout=30)
    try:
        assert os.getpgid(child) == child and os.getsid(child) == leader.pid
        end_leftover_group(leader.pid, grace=0.0)  # what the drain did before: the child is not in that group
        assert alive(child)
        assert session_members(leader.pid) == [child]
        kill_session_leftovers(leader.pid)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child)
        assert leader.stdout.read() == ""  # its pipe reached EOF: nothing holds it any more
    finally:
        if alive(child):
            os.kill(child, 9)


def test_broken_run_leftovers_none_for_a_session_that_ended_whole():
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    leader.wait(timeout=30)
    assert session_members(leader.pid) == []
    kill_session_leftovers(leader.pid)  # nothing to do, nothing raised


def test_broken_run_a_shims_exit_note_is_an_event_at_once(tmp_path):
    """The lost-worker watch's signal where it cannot watch the cluster (runtime/exit_notes.py): a
    note the shim leaves (rsh_agent/shim.py record_exit) sets it within a few looks."""
    from mpilaunch.rsh_agent.shim import record_exit
    from mpilaunch.runtime.exit_notes import noted_exits

    context = tmp_path / "context.json"
    with noted_exits(tmp_path) as changed:
        assert not changed.wait(0.2)  # nothing ended: no event
        record_exit(str(context), "w-1", 255)
        assert changed.wait(5.0)
        changed.clear()
        assert not changed.wait(0.2)  # the same note again is no news
