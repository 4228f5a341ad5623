"""Rank program: mpi4py Allreduce bus bandwidth, 1 MiB to 64 MiB (stdlib buffers).

busbw = algbw x 2(n-1)/n (the nccl-tests definition); rank 0 prints one JSON
line with the best of ``REPS`` timed rounds per size.
"""

import json
import os
from array import array

from mpi4py import MPI

comm = MPI.COMM_WORLD
n = comm.size
reps = int(os.environ.get("REPS", "5"))
result = {}
for mib in (1, 4, 16, 64):
    count = mib * 1024 * 1024 // 8
    send = array("d", bytes(count * 8))
    recv = array("d", bytes(count * 8))
    iters = max(4, 64 // mib)
    comm.Allreduce(send, recv, op=MPI.SUM)  # warm-up: connections, buffers
    best = float("inf")
    for _ in range(reps):
        comm.Barrier()
        t0 = MPI.Wtime()
        for _ in range(iters):
            comm.Allreduce(send, recv, op=MPI.SUM)
        elapsed = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX) / iters
        best = min(best, elapsed)
    algbw = count * 8 / best / 1e9
    result[f"{mib}MiB"] = round(algbw * 2 * (n - 1) / n, 4)
if comm.rank == 0:
    print("BUSBW " + json.dumps({"ranks": n, "busbw_GBps": result}), flush=True)
