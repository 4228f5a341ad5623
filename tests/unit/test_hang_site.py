"""The no-tool fallback of the hang probe: the sitecustomize the rank wrapper puts on PYTHONPATH.

Real Pythons, started as the wrapper starts a program (``rank.with_stacks_site``),
and the probe's own reading side (``probe.faulthandler_frames``).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from mpilaunch import rank
from mpilaunch.hang import probe

# one line: the dump finds it there whether or not it got from the print to the sleep yet
SLEEPER = "import sys, time\nprint('up', flush=True); time.sleep(60)\n"


def started(tmp_path, pythonpath, code=SLEEPER):
    script = tmp_path / "sleeper.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc, script


@pytest.fixture
def stop():
    procs = []
    yield procs.append
    for p in procs:
        p.kill()
        p.wait()


def test_hang_site_dump_shows_the_main_threads_python_frames(tmp_path, stop):
    proc, script = started(tmp_path, rank.with_stacks_site(None))
    stop(proc)
    assert probe.catches(proc.pid, probe.stacks_signal())
    frames, why = probe.faulthandler_frames(proc.pid, "S", 3.0)
    assert why == ""
    assert frames == [
        {
            "function": "<module>",
            "file": str(script),
            "line": 2,
            "kind": "python",
            "code": "print('up', flush=True); time.sleep(60)",
        }
    ]
    # asked again: the second dump is read, not the first twice
    again, _ = probe.faulthandler_frames(proc.pid, "S", 3.0)
    assert again == frames
    assert proc.poll() is None  # the signal did not end it


def test_hang_site_runs_the_sitecustomize_it_hides(tmp_path, stop):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    code = "import os, sys\nprint('up', flush=True)\nprint(os.environ.get('THEIRS_RAN'), flush=True)\n"
    proc, _ = started(tmp_path, rank.with_stacks_site(str(theirs)), code)
    stop(proc)
    assert proc.stdout.readline() == "yes\n"


def test_hang_site_not_armed_the_probe_sends_nothing(tmp_path, stop):
    """A Python without mpilaunch's sitecustomize does not catch the signal, whose default
    action would end it: the probe leaves it alone."""
    proc, _ = started(tmp_path, None)
    stop(proc)
    assert not probe.catches(proc.pid, probe.stacks_signal())
    frames, why = probe.faulthandler_frames(proc.pid, "S", 1.0)
    assert frames is None and "no mpilaunch faulthandler armed" in why
    time.sleep(0.2)
    assert proc.poll() is None


def test_hang_site_a_stopped_process_is_not_signalled(tmp_path, stop):
    proc, _ = started(tmp_path, rank.with_stacks_site(None))
    stop(proc)
    os.kill(proc.pid, signal.SIGSTOP)
    frames, why = probe.faulthandler_frames(proc.pid, "T", 1.0)
    assert frames is None and why.startswith("stopped")
    assert probe.stacks_signal() not in pending_signals(proc.pid)


def pending_signals(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("ShdPnd:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    return set()


def test_hang_site_probe_without_py_spy_when_told_none(monkeypatch):
    monkeypatch.setenv("MPILAUNCH_PY_SPY", probe.NO_PY_SPY)
    assert probe.find_py_spy(None) is None
    assert probe.find_py_spy(probe.NO_PY_SPY) is None
