"""A training loop of allreduce steps (mpi4py), one rank slow in its data loading.

    python straggler.py STEPS SLOW_RANK STEP_S

Every rank "computes" (waits) for STEP_S / 4 seconds per step; rank SLOW_RANK (-1: none) also loads
its batch for 2 * STEP_S seconds (time.sleep in ``load_batch``), so the others wait for it in
MPI_Allreduce; then every rank joins the step's allreduce. Of the time the others wait, the slow
rank spends 7/8 loading and 1/8 computing: its place is named by a clear majority of the samples
(at 3/4 against 1/4, one test in ~30 would name its compute call by chance). A healthy job (SLOW_RANK -1) is the
same loop with nobody slow.
"""

import select
import sys
import time
from array import array

from mpi4py import MPI


def load_batch(seconds):
    time.sleep(seconds)  # the straggler's data loading


def compute(seconds):
    # A wait, not a busy loop: 8 ranks spinning on a 2-core machine that other tests load (CI, load
    # 12) made one rank really lag, 36% of samples (rank 4, 2026-12-07), so "nobody is slow" was
    # not true of the healthy job (a rank slowed by its machine is a straggler mpilaunch should
    # name). select, not time.sleep: the straggler's place is named by its innermost call, and
    # load_batch's must stay the only time.sleep.
    select.select([], [], [], seconds)


def main():
    steps, slow, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    comm = MPI.COMM_WORLD
    mine, total = array("d", [comm.rank + 1.0]), array("d", [0.0])
    for _ in range(steps):
        if comm.rank == slow:
            load_batch(2 * step_s)
        compute(step_s / 4)
        comm.Allreduce(mine, total, op=MPI.SUM)  # a gradient buffer's allreduce
    if comm.rank == 0:
        print("done", total[0], flush=True)


main()
