"""Rank FAIL_RANK (or each of a comma-separated list) prints a few lines and exits FAIL_CODE; the others wait to be killed.

With FAIL_BARRIER (a directory every rank can see), the failing ranks wait for
each other before they exit and ignore SIGTERM from then on: every one of them
then fails by itself, none is ended by mpirun's teardown after the first
failure, however late the machine's load lets it start.

With VANISH_ON_TERM, the other ranks answer SIGTERM by SIGKILLing their own
wrapper (mpilaunch.rank, their parent) before they exit: no exit status line
ever comes for them, as for a rank whose wrapper was killed.
"""

import os
import signal
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
failing = {int(r) for r in os.environ.get("FAIL_RANK", "3").split(",")}
if rank in failing:
    for i in range(3):
        print(f"rank {rank} working step {i}", flush=True)
    barrier = os.environ.get("FAIL_BARRIER")
    if barrier:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(barrier, str(rank)), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(barrier)) < len(failing) and time.monotonic() < deadline:
            time.sleep(0.002)
    print(f"rank {rank} about to fail", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "7")))
if os.environ.get("VANISH_ON_TERM"):

    def vanish(_signum, _frame):
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(143)

    signal.signal(signal.SIGTERM, vanish)
print(f"rank {rank} started", flush=True)
time.sleep(float(os.environ.get("SLEEP", "120")))
