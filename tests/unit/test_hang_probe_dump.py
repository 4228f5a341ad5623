"""The probe's "dump these processes" entry (hang/probe.py dump_processes), which the suite's own stall
diagnosis uses (support.helpers.python_stacks): every thread of real Python processes, by py-spy."""

import subprocess
import sys
import time

import pytest

from mpilaunch.hang import probe

PROGRAM = """
import threading, time
def wait_here():
    time.sleep(60)
threading.Thread(target=wait_here, name="helper-thread", daemon=True).start()
print("up", flush=True)
wait_here()
"""


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    yield proc
    proc.kill()
    proc.wait()


def test_hang_probe_dumps_every_thread_of_given_processes(sleeper):
    if probe.find_py_spy(None) is None:
        pytest.skip("py-spy (the test extra) is not installed")
    time.sleep(0.2)  # the helper thread is in its sleep too
    stopped = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
    try:
        while probe.stat_of(stopped.pid)[0] not in "Tt":
            time.sleep(0.05)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        running, stopped_entry, gone_entry = probe.dump_processes([sleeper.pid, stopped.pid, gone.pid], budget=30)
    finally:
        stopped.kill()
        stopped.wait()
    assert running["pid"] == sleeper.pid and running["note"] == "", running
    threads = {t["name"]: t for t in running["threads"]}
    assert set(threads) == {"MainThread", "helper-thread"}, running
    main = threads["MainThread"]
    assert main["id"] == sleeper.pid
    assert [(f["function"], f["line"]) for f in main["frames"]] == [("wait_here", 4), ("<module>", 7)]
    assert [f["function"] for f in threads["helper-thread"]["frames"]][0] == "wait_here"
    # a stopped process cannot be suspended by py-spy: read without blocking it
    assert stopped_entry["state"] in "Tt" and stopped_entry["tool"] == "py-spy --nonblocking", stopped_entry
    assert gone_entry["note"] == "gone" and gone_entry["threads"] == []
