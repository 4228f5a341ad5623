"""An MPI allreduce with nothing but the image's python3 and its MPI library (ctypes, no mpi4py).

For images with an MPI and no mpi4py built on it (Debian's python3-mpi4py
exists only for Open MPI). Sums the ranks + 1 and prints one JSON line:
rank, size, sum, library, worker (MPILAUNCH_WORKER), pod, hostname, ip.
The handles are MPICH's ABI (MPI_COMM_WORLD, MPI_INT, MPI_SUM are integers);
Open MPI's are pointers to globals, looked up by name.

Tests pass its text as ``python3 -c TEXT`` into images that do not have it.
"""

import ctypes
import ctypes.util
import json
import os
import socket
import sys

name = ctypes.util.find_library("mpich") or ctypes.util.find_library("mpi")
lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
lib.MPI_Init(None, None)
if "mpich" in name:
    world, mpi_int, mpi_sum = ctypes.c_int(0x44000000), ctypes.c_int(0x4C000405), ctypes.c_int(0x58000003)
else:
    world, mpi_int, mpi_sum = (
        ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, n)))
        for n in ("ompi_mpi_comm_world", "ompi_mpi_int", "ompi_mpi_op_sum")
    )
rank, size = ctypes.c_int(), ctypes.c_int()
lib.MPI_Comm_rank(world, ctypes.byref(rank))
lib.MPI_Comm_size(world, ctypes.byref(size))
mine, total = ctypes.c_int(rank.value + 1), ctypes.c_int()
lib.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, mpi_int, mpi_sum, world)
host = socket.gethostname()
try:
    ip = socket.gethostbyname(host)
except OSError:
    ip = None
sys.stdout.write(
    json.dumps(
        {
            "rank": rank.value,
            "size": size.value,
            "sum": total.value,
            "library": name,
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "pod": os.environ.get("POD_NAME"),
            "hostname": host,
            "ip": ip,
        }
    )
    + "\n"
)
sys.stdout.flush()
lib.MPI_Finalize()
