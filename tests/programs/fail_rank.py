"""Rank FAIL_RANK (or each of a comma-separated list) prints a few lines and exits FAIL_CODE; the others wait to be killed."""

import os
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or 0)
if rank in {int(r) for r in os.environ.get("FAIL_RANK", "3").split(",")}:
    for i in range(3):
        print(f"rank {rank} working step {i}", flush=True)
    print(f"rank {rank} about to fail", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "7")))
print(f"rank {rank} started", flush=True)
time.sleep(float(os.environ.get("SLEEP", "120")))
