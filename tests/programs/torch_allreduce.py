"""Rank program for tests: torch.distributed's env:// rendezvous, a gloo allreduce of the ranks,
then one line ``TORCHENV {json}`` with the variables it was given and what torch made of them.

Runs under Debian's /usr/bin/python3 with python3-torch (CPU, gloo). Nothing
here sets the rendezvous variables: they come from mpilaunch's rank wrapper
(or from the user's ``-x``). The one exception is for a cluster whose pod
names do not resolve (kwok): ``TORCH_TEST_CONNECT_ADDR``/``_PORT``, when set,
replace MASTER_ADDR/MASTER_PORT for the connection only, after the given
values were recorded.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
given = {name: os.environ.get(name) for name in NAMES}
for name in ("ADDR", "PORT"):
    if os.environ.get(f"TORCH_TEST_CONNECT_{name}"):
        os.environ[f"MASTER_{name}"] = os.environ[f"TORCH_TEST_CONNECT_{name}"]

dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=90))
rank, size = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank)])
dist.all_reduce(value, op=dist.ReduceOp.SUM)
expected = size * (size - 1) / 2
print(
    "TORCHENV "
    + json.dumps(
        {
            "env": given,
            "rank": rank,
            "size": size,
            "sum": value.item(),
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "backend": dist.get_backend(),
        }
    ),
    flush=True,
)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if value.item() == expected else 1)
