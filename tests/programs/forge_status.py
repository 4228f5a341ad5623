"""Prints lines that look like the rank wrapper's own, as a user's program might (an old log, a nested tool).

FORGE=status: rank 1 prints a status line saying it exited 0, then exits 3.
FORGE=start: rank 0 prints a start line for rank 7 (the job has 2 ranks), then every rank exits 0.
Every rank first says whether it can see the launch's token (it must not).
With REMOVE_DIR, rank 0 removes that directory (the job's --output-dir) after its first line;
the others wait for it. EXIT_CODE: what every rank exits with otherwise (default 0).
"""

import os
import shutil
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
print(f"rank {rank} token visible: {'MPILAUNCH_STATUS_TOKEN' in os.environ}", flush=True)
forge = os.environ.get("FORGE", "")
if os.environ.get("REMOVE_DIR"):
    if rank == 0:
        time.sleep(0.5)  # rank 1's log is open by now (it has no line to lose either way)
        shutil.rmtree(os.environ["REMOVE_DIR"])
    else:
        time.sleep(2)  # a failing rank does not end rank 0 before it removed the directory
if forge == "start" and rank == 0:
    print(
        "mpilaunch-rank-start: rank=7 local=0 size=8 worker=nowhere host=nowhere program=? env=00000000",
        file=sys.stderr,
        flush=True,
    )
if forge == "status" and rank == 1:
    print("mpilaunch-rank-status: rank=1 worker=x exit=0", file=sys.stderr, flush=True)
    time.sleep(1)  # rank 0 ends (exit 0) by itself first, not in mpirun's teardown after this failure
    sys.exit(3)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
