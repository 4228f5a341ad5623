"""Rank program for tests: MPI_COMM_TYPE_SHARED's group (as world ranks), one JSON line per rank.

Also where the rank runs by name: its worker (set by the worker's exec agent), its host name and
what that name resolves to there (None where it resolves nowhere).
"""

import json
import os
import socket

from mpi4py import MPI


def address(name):
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


world = MPI.COMM_WORLD
shared = world.Split_type(MPI.COMM_TYPE_SHARED)
group = MPI.Group.Translate_ranks(shared.Get_group(), list(range(shared.size)), world.Get_group())
shared.Barrier()  # ranks that disagree about the groups wait here for ever
host = socket.gethostname()
print(
    "SHARED "
    + json.dumps(
        {
            "rank": world.rank,
            "group": sorted(group),
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "hostname": host,
            "address": address(host),
        }
    ),
    flush=True,
)
