"""A job that hangs on purpose, with the odd rank and its stuck line known in advance (issue 42).

``hang.py MODE ODD_RANK``: every rank prints "ready", then every rank but
ODD_RANK waits in MPI_Allreduce (mpi4py) (recv mode: in a barrier) while
ODD_RANK, per MODE:
  sleep  sleeps before the allreduce (time.sleep)
  stop   stops itself (SIGSTOP) before the allreduce
  busy   spins in a Python loop, never reaching the allreduce
  recv   blocks in MPI_Recv from a rank that never sends
Nothing is printed after "ready". The tests find the lines marked "STUCK:"
below in this file, so they need not hard-code line numbers.
"""

import os
import signal
import sys
import time
from array import array

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
mode, odd = sys.argv[1], int(sys.argv[2])
mine, total = array("i", [rank]), array("i", [0])
comm.Allreduce(mine, total, op=MPI.SUM)  # a first allreduce that every rank gets through
print(f"rank {rank} ready", flush=True)
comm.Barrier()  # every rank printed before anyone is stuck: the stall clock starts with nothing in flight


def spin():
    x = 0
    while True: x += 1  # noqa: E701  STUCK: busy (one line: every sample finds the rank on it)  # fmt: skip


if rank == odd:
    if mode == "sleep":
        time.sleep(600)  # STUCK: sleep
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # STUCK: stop
    elif mode == "busy":
        spin()
    elif mode == "recv":
        buf = bytearray(8)
        comm.Recv(buf, source=(odd + 1) % size, tag=42)  # STUCK: recv
if mode == "recv":
    comm.Barrier()  # STUCK: others-recv
else:
    comm.Allreduce(mine, total, op=MPI.SUM)  # STUCK: others
print(f"rank {rank} done", flush=True)
