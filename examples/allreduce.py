"""Allreduce example: every rank contributes rank+1; all must see n(n+1)/2.

Each rank also says which worker it ran on (MPILAUNCH_WORKER, set by the
worker's exec agent), which shows the placement mpilaunch chose.
"""

import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
expected = size * (size + 1) // 2
worker = os.environ.get("MPILAUNCH_WORKER", socket.gethostname())
print(f"rank {rank}/{size} on {worker}: allreduce sum = {total} (expected {expected})", flush=True)
if total != expected:
    raise SystemExit(f"rank {rank}: wrong allreduce result {total} != {expected}")
if rank == 0:
    print(f"allreduce OK: sum of 1..{size} = {total}", flush=True)
