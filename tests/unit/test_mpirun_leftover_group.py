"""mpirun ended, something of its process group holds its pipes: the workload must not wait for it.

On real pods a shim whose exec stream goes to a pod being deleted lives on for the pod's grace
period after mpirun has ended, holding mpirun's stdout open; the workload's wait for the pipes
then held a lost worker's relaunch back by 4-5 s (once 68 s). Real processes: a shell that leaves
a child in its group holding the pipe, as such a shim does."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil

from mpilaunch.workloads.mpirun import MpirunWorkload


def test_a_group_left_holding_the_pipes_after_mpirun_ended_is_ended_promptly():
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; echo mpirun done"], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    lines: list[str] = []
    pump = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    pump.start()
    proc.wait()
    workload = object.__new__(MpirunWorkload)  # only the pipe handling: no job around it
    workload.proc, workload.pumps = proc, [pump]
    t0 = time.monotonic()
    workload._drain_pumps()
    took = time.monotonic() - t0
    assert not pump.is_alive() and took < 3.0, took
    assert lines[1:] == ["mpirun done\n"]  # mpirun's last line is kept
    leftover = int(lines[0])
    assert not psutil.pid_exists(leftover) or psutil.Process(leftover).status() == psutil.STATUS_ZOMBIE


def test_pipes_that_close_with_mpirun_are_read_to_the_end_without_waiting():
    proc = subprocess.Popen(["sh", "-c", "echo last"], stdout=subprocess.PIPE, start_new_session=True, text=True)
    lines: list[str] = []
    pump = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    pump.start()
    proc.wait()
    workload = object.__new__(MpirunWorkload)
    workload.proc, workload.pumps = proc, [pump]
    t0 = time.monotonic()
    workload._drain_pumps()
    assert lines == ["last\n"] and time.monotonic() - t0 < 0.5
