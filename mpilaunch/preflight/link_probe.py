"""--preflight across workers: one rank per worker, under the job's own mpirun and MPI library.

Sent as ``python3 -c TEXT FLAVOUR BYTES REPEATS MARGIN FLOOR_S [LIBRARY...]`` (standard
library and ctypes only: any image with a python3 and an MPI runs it, no mpi4py needed). Each
ring link is timed alone, in turn: rank k sends BYTES to rank k+1 and waits for a one-byte
answer, best of REPEATS, while every other rank waits for its own turn (a slow link then slows
its own measurement only, not a simultaneous exchange of every rank). Every rank then learns
every link's time (an allgather), and the links slower than the median by more than MARGIN
(and FLOOR_S) are timed again, four times as often: a descheduled moment on a loaded machine
passes, a slow link does not. Then every rank takes part in an allreduce of BYTES, best of
REPEATS. Each rank prints one line: ``mpilaunch-link: {json}``.

Handles: Open MPI's are the addresses of its global objects, looked up by name; MPICH's and
Intel MPI's (one ABI) are integer constants.
"""

import ctypes
import json
import os
import socket
import sys
import time

MARK = "mpilaunch-link: "
GO, READY, DATA, DONE = 71, 72, 73, 74  # message tags
#: the library names each flavour's library goes by (Debian's MPICH: libmpich.so.12)
SONAMES = {"openmpi": ("libmpi.so.40",), "mpich": ("libmpich.so.12", "libmpi.so.12"), "intel": ("libmpi.so.12",)}
# MPICH's ABI: MPI_COMM_WORLD, MPI_BYTE, MPI_DOUBLE, MPI_SUM, and MPI_STATUS_IGNORE ((MPI_Status *) 1)
_MPICH = (0x44000000, 0x4C00010D, 0x4C00080B, 0x58000003, 1)


def load(flavour: str, candidates: list) -> tuple:
    """The MPI library the job's mpirun belongs with: the given paths where this worker has them,
    else the flavour's soname as the loader finds it (mpirun's prefix is on LD_LIBRARY_PATH)."""
    tried = []
    for path in [*candidates, *SONAMES.get(flavour, SONAMES["openmpi"])]:
        if "/" in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise SystemExit(f"mpilaunch-link: no MPI library: {'; '.join(tried) or 'none found'}")


def handles(lib, flavour: str) -> tuple:
    if flavour == "openmpi":

        def named(symbol):
            return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, symbol)))

        objects = ("ompi_mpi_comm_world", "ompi_mpi_byte", "ompi_mpi_double", "ompi_mpi_op_sum")
        return (*(named(s) for s in objects), ctypes.c_void_p(0))
    world, byte, double, total, ignore = _MPICH
    return ctypes.c_int(world), ctypes.c_int(byte), ctypes.c_int(double), ctypes.c_int(total), ctypes.c_void_p(ignore)


def reference(edges: list) -> float:
    """What a good link takes: the median, over the workers, of each one's faster link (its link in
    from the previous worker, or out to the next). One slow worker slows both of its links, but
    each neighbour keeps one fast: the reference holds from three workers on (a plain median of the
    links would be a slow one with three)."""
    n = len(edges)
    best = sorted(min(edges[(i - 1) % n], edges[i]) for i in range(n))
    return best[n // 2] if n % 2 else (best[n // 2 - 1] + best[n // 2]) / 2


def main(argv: list) -> int:
    flavour, nbytes, repeats, margin, floor_s = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4])
    lib, path = load(flavour, argv[5:])
    lib.MPI_Wtime.restype = ctypes.c_double
    lib.MPI_Init(None, None)
    world, byte, double, total, ignore = handles(lib, flavour)
    rank, size = ctypes.c_int(), ctypes.c_int()
    lib.MPI_Comm_rank(world, ctypes.byref(rank))
    lib.MPI_Comm_size(world, ctypes.byref(size))
    me, n = rank.value, size.value
    big, ack = ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(1)
    request = ctypes.c_void_p if flavour == "openmpi" else ctypes.c_int  # MPI_Request: a pointer, or an int

    def quietly(request_handle) -> None:
        """Wait for a request without spinning: a rank waiting its turn leaves the CPU to the two
        that time their link (MPI's own waits poll, and on a loaded machine they slow the others)."""
        done = ctypes.c_int(0)
        while True:
            lib.MPI_Test(ctypes.byref(request_handle), ctypes.byref(done), ignore)
            if done.value:
                return
            time.sleep(0.0005)

    def receive_quietly(buf, count: int, source: int, tag: int) -> None:
        handle = request()
        lib.MPI_Irecv(buf, count, byte, source, tag, world, ctypes.byref(handle))
        quietly(handle)

    def barrier_quietly() -> None:
        handle = request()
        lib.MPI_Ibarrier(world, ctypes.byref(handle))
        quietly(handle)

    def time_links(links, times: int):
        """Each link k (rank k -> k+1) in turn, alone; this rank's best time on its own link. The
        receiver waits quietly for its turn (GO), says it listens (READY); then the timing."""
        best = None
        for k in links:
            to, frm = (k + 1) % n, k
            if me == frm:
                lib.MPI_Send(ack, 1, byte, to, GO, world)
                lib.MPI_Recv(ack, 1, byte, to, READY, world, ignore)
                for _ in range(times):
                    t0 = lib.MPI_Wtime()
                    lib.MPI_Send(big, nbytes, byte, to, DATA, world)
                    lib.MPI_Recv(ack, 1, byte, to, DONE, world, ignore)
                    took = lib.MPI_Wtime() - t0
                    best = took if best is None else min(best, took)
            elif me == to:
                receive_quietly(ack, 1, frm, GO)
                lib.MPI_Send(ack, 1, byte, frm, READY, world)
                for _ in range(times):
                    lib.MPI_Recv(big, nbytes, byte, frm, DATA, world, ignore)
                    lib.MPI_Send(ack, 1, byte, frm, DONE, world)
        return best

    edge_s = time_links(range(n) if n > 1 else (), repeats)
    if n > 1:
        # every rank learns every link's time and asks the slow ones again, longer: a link slowed
        # by a moment's load passes on a second look, a slow link stays slow
        mine, every = ctypes.c_double(edge_s or 0.0), (ctypes.c_double * n)()
        barrier_quietly()
        lib.MPI_Allgather(ctypes.byref(mine), 1, double, every, 1, double, world)
        median = reference([every[k] for k in range(n)])
        limit = max(median * (1 + margin), median + floor_s)
        suspects = [k for k in range(n) if every[k] > limit]
        again = time_links(suspects, 4 * repeats)
        if again is not None and me in suspects:
            edge_s = min(edge_s, again)
    count = max(1, nbytes // 8)
    send, recv = (ctypes.c_double * count)(), (ctypes.c_double * count)()
    allreduce_s = None
    barrier_quietly()
    for _ in range(repeats):
        lib.MPI_Barrier(world)
        t0 = lib.MPI_Wtime()
        lib.MPI_Allreduce(send, recv, count, double, total, world)
        took = lib.MPI_Wtime() - t0
        allreduce_s = took if allreduce_s is None else min(allreduce_s, took)
    said = {
        "rank": me,
        "size": n,
        "worker": os.environ.get("MPILAUNCH_WORKER"),
        "host": socket.gethostname(),
        "bytes": nbytes,
        "edge_s": edge_s,  # this rank's link to the next rank, alone (None: one rank)
        "allreduce_s": allreduce_s,
        "library": path,
    }
    sys.stdout.write(MARK + json.dumps(said) + "\n")
    sys.stdout.flush()
    lib.MPI_Finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
