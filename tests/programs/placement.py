"""Rank program for tests: allreduce, then one JSON line saying where it ran.

MPILAUNCH_WORKER is set only by a worker's exec agent: a rank that mpirun
forked next to itself (the classic failure of exec-based launchers) has none.
"""

import json
import os
import socket
import sys

from mpi4py import MPI


def own_ip():
    """The address this host's name resolves to: in a real pod, the pod IP (kubelet's /etc/hosts)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
print(
    json.dumps(
        {
            "rank": comm.rank,
            "size": comm.size,
            "sum": total,
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "pod": os.environ.get("POD_NAME"),
            "hostname": socket.gethostname(),
            "ip": own_ip(),
            "session": os.environ.get("MPILAUNCH_SESSION"),
            "library": MPI.Get_library_version().splitlines()[0],
            "pid": os.getpid(),
        }
    ),
    flush=True,
)
sys.exit(int(os.environ.get("PLACEMENT_EXIT", "0")))
