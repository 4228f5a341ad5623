"""Rank program for tests: a real Horovod (PyTorch, CPU) job, then one line ``HOROVOD {json}``.

hvd.init(), then an allreduce (Sum of each rank's number), a broadcast from
rank 0 and an allgather; the line holds Horovod's own view of the job
(rank, size, local rank and size, cross rank and size, which controller ran)
next to mpilaunch's plan (MPILAUNCH_WORKER and the rank wrapper's variables),
and the collectives' results. Then one real training step: a small
torch.nn.Linear whose initial weights differ per rank, hvd.broadcast_parameters
from rank 0, hvd.DistributedOptimizer over SGD, rank-dependent data, one
step(); an allgather of the flattened parameters before and after checks
that every rank started from rank 0's and ends identical, that they moved,
and by the step the average of the ranks' own gradients gives (the "train"
entry of the line). The exit status is 0 only if every result is right on
this rank.

HVD_FAIL_RANK=R (with HVD_FAIL_CODE, default 43): rank R exits with that code
right after hvd.init() and the first collective (the allreduce), the others
are then stuck in the next one: what a rank dying inside a Horovod job looks
like to mpilaunch.

Runs under the interpreter scripts/build-horovod.sh built
(``~/.cache/mpilaunch-horovod/openmpi/venv/bin/python``).

Controllers:
- default: MPI. mpirun started the ranks; Horovod reads everything from MPI.
- ``--gloo``: Horovod's Gloo controller and Gloo collectives, with mpirun only
  as the process launcher (what ``horovodrun --gloo`` does over ssh). Horovod
  then needs an HTTP rendezvous and its HOROVOD_* variables: rank 0 serves
  Horovod's own rendezvous server at MASTER_ADDR:MASTER_PORT, the address and
  free port mpilaunch's rank wrapper chose on worker 0 (as for
  torch.distributed), and every rank derives HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*
  from the wrapper's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
  NODE_RANK. Workers must hold the same number of ranks (the plan rank 0
  serves assumes it). Under mpirun, Horovod 0.28.1 cannot mix the two (MPI
  controller with Gloo collectives crashes), so this is Gloo throughout.
"""

import json
import os
import socket
import sys
import threading
import time

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
given = {name: os.environ.get(name) for name in NAMES}
gloo = "--gloo" in sys.argv[1:]


def serve_gloo_rendezvous(port: int, nodes: int, slots: int) -> None:
    """Horovod's HTTP rendezvous (what horovodrun runs) in this process, for the whole job."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    plan = get_host_assignments(parse_hosts(",".join(f"node{n}:{slots}" for n in range(nodes))), nodes * slots)
    server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    server.init(plan)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def wait_for(addr: str, port: int, seconds: float = 60) -> None:
    """Horovod's HTTP store gives up after a few tries: wait until rank 0 serves."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if gloo:
    rank, size = int(given["RANK"]), int(given["WORLD_SIZE"])
    local_rank, slots, node = int(given["LOCAL_RANK"]), int(given["LOCAL_WORLD_SIZE"]), int(given["NODE_RANK"])
    assert size % slots == 0, f"--gloo needs workers of equal size: {given}"
    os.environ.update(
        {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": given["MASTER_ADDR"],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": given["MASTER_PORT"],
            "HOROVOD_HOSTNAME": f"node{node}",
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank),
            "HOROVOD_LOCAL_SIZE": str(slots),
            "HOROVOD_CROSS_RANK": str(node),
            "HOROVOD_CROSS_SIZE": str(size // slots),
        }
    )
    if rank == 0:
        serve_gloo_rendezvous(int(given["MASTER_PORT"]), size // slots, slots)
    else:
        wait_for(given["MASTER_ADDR"], int(given["MASTER_PORT"]))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="sum").item()
if os.environ.get("HVD_FAIL_RANK") == str(rank):
    print(f"HOROVOD rank {rank} fails on purpose after the first collective", file=sys.stderr, flush=True)
    os._exit(int(os.environ.get("HVD_FAIL_CODE", "43")))
root_value = hvd.broadcast(torch.tensor([100.0 + rank]), root_rank=0, name="bcast").item()
gathered = hvd.allgather(torch.tensor([rank]), name="gather").tolist()
ok = total == size * (size - 1) / 2 and root_value == 100.0 and gathered == list(range(size))


def train_step() -> dict:
    """One data-parallel SGD step; what every rank can check of it."""
    lr = 0.1
    torch.manual_seed(rank)  # a different initialisation on every rank: the broadcast must fix it
    model = torch.nn.Linear(4, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    before = flat(model).clone()
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    x, y = torch.randn(8, 4, generator=data), torch.randn(8, 2, generator=data)
    # this rank's own gradient, from a copy Horovod's hooks do not see
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    torch.nn.functional.mse_loss(ref(x), y).backward()
    own_grad = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters()
    )
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    after = flat(model)
    befores = hvd.allgather(before.unsqueeze(0), name="params_before")
    afters = hvd.allgather(after.unsqueeze(0), name="params_after")
    mean_grad = hvd.allgather(own_grad.unsqueeze(0), name="own_grads").mean(dim=0)
    return {
        "broadcast": all(torch.equal(b, befores[0]) for b in befores),
        "identical": all(torch.equal(a, afters[0]) for a in afters),
        "moved": not torch.equal(after, before),
        "averaged": torch.allclose(after, before - lr * mean_grad, atol=1e-6),
        "params": len(after),
        "loss": round(loss.item(), 6),
    }


train = train_step()
ok = ok and all(train[k] for k in ("broadcast", "identical", "moved", "averaged"))
print(
    "HOROVOD "
    + json.dumps(
        {
            "env": given,
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "rank": rank,
            "size": size,
            "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(),
            "controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else None,
            "sum": total,
            "broadcast": root_value,
            "allgather": gathered,
            "train": train,
            "version": __import__("horovod").__version__,
            # the MPI library this process loaded (Horovod links it whichever controller runs)
            "libmpi": next((line.split()[-1] for line in open("/proc/self/maps") if "/libmpi.so" in line), None),
        }
    ),
    flush=True,
)
# rank 0's rendezvous server lives in this process: nobody leaves before all are done
hvd.join()
hvd.shutdown()
sys.exit(0 if ok else 1)
