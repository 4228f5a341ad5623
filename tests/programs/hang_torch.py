"""A torch.distributed gloo job that hangs on purpose: one rank sleeps before an all_reduce (issue 42).

``hang_torch.py ODD_RANK``: init_process_group("gloo") from the rank
wrapper's variables, a first all_reduce every rank gets through, "ready",
a barrier; then ODD_RANK sleeps while the others wait in the next
all_reduce (gloo's timeout is 30 minutes). Nothing is printed after
"ready". The tests find the lines marked "STUCK:" below.

Runs under Debian's /usr/bin/python3 with python3-torch.
"""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, odd = dist.get_rank(), int(sys.argv[1])
t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank} ready", flush=True)
dist.barrier()  # every rank printed before anyone is stuck
if rank == odd:
    time.sleep(600)  # STUCK: sleep
dist.all_reduce(t)  # STUCK: others
print(f"rank {rank} done", flush=True)
