"""A Horovod job (MPI controller, PyTorch, CPU) that hangs on purpose: one rank skips a tensor (issue 42).

``hang_horovod.py ODD_RANK``: after hvd.init() and a first allreduce every
rank gets through, every rank prints "ready"; then every rank but ODD_RANK
allreduces the tensor "grad_a" while ODD_RANK skips it and waits in the
allreduce of "grad_b", which the others never reach: Horovod's coordinator
waits for ever for ODD_RANK's "grad_a". The main thread of each rank waits
in hvd.allreduce (its background thread does the MPI); the verdict must name
ODD_RANK and its line, not Horovod's thread. Horovod's own stall warnings
(60 s) are off, so nothing is printed after "ready". The tests find the
lines marked "STUCK:" below.

Runs under the interpreter scripts/build-horovod.sh built.
"""

import os
import sys

import horovod.torch as hvd
import torch

os.environ.setdefault("HOROVOD_STALL_CHECK_DISABLE", "1")  # read by hvd.init()
hvd.init()
rank, odd = hvd.rank(), int(sys.argv[1])
hvd.allreduce(torch.tensor([float(rank)]), name="warmup")
print(f"rank {rank} ready", flush=True)
hvd.allreduce(torch.tensor([0.0]), name="ready")  # every rank printed before anyone is stuck
if rank != odd:
    hvd.allreduce(torch.ones(4), name="grad_a")  # STUCK: others
hvd.allreduce(torch.ones(4), name="grad_b")  # STUCK: skipped
print(f"rank {rank} done", flush=True)
