"""Jobs on the ssh testbed (testbeds/ssh): the MPIs its hosts have, the command line, and the check
that every host is as before a job (its sshd alone, an empty TMPDIR)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

from support.helpers import REPO, mpilaunch_env

PYTHON = "/usr/bin/python3"  # Debian's, on every host: the same program here and there (environment check)

# An allreduce through Open MPI's library, no mpi4py; each rank says where it ran, as whom.
OPENMPI_ALLREDUCE = """
import ctypes, json, os, socket
lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
lib.MPI_Init(None, None)
world, mpi_int, mpi_sum = (ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, n)))
                           for n in ("ompi_mpi_comm_world", "ompi_mpi_int", "ompi_mpi_op_sum"))
rank, size, total = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
lib.MPI_Comm_rank(world, ctypes.byref(rank))
lib.MPI_Comm_size(world, ctypes.byref(size))
lib.MPI_Allreduce(ctypes.byref(ctypes.c_int(rank.value + 1)), ctypes.byref(total), 1, mpi_int, mpi_sum, world)
print(json.dumps({"rank": rank.value, "size": size.value, "sum": total.value, "uid": os.getuid(),
                  "worker": os.environ.get("MPILAUNCH_WORKER"), "hostname": socket.gethostname(),
                  "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")]}), flush=True)
lib.MPI_Finalize()
"""


@dataclass(frozen=True)
class Flavour:
    id: str
    mpirun: str
    allreduce: tuple[str, ...]  # the rank program: an allreduce that prints one JSON line per rank


FLAVOURS = {
    "openmpi4": Flavour("openmpi4", "/usr/bin/mpirun.openmpi", (PYTHON, "-c", OPENMPI_ALLREDUCE)),
    # MPICH's hydra: its proxies connect back to mpiexec (the backend's control address)
    "mpich": Flavour("mpich", "/usr/bin/mpiexec.hydra", (PYTHON, str(REPO / "tests/programs/ctypes_allreduce.py"))),
}


OPENMPI4 = FLAVOURS["openmpi4"]
MPILAUNCH = (sys.executable, "-m", "mpilaunch")


def argv(bed, hostfile, mpi: Flavour, *args) -> list[str]:
    return [
        *MPILAUNCH,
        "--backend",
        "ssh",
        "--ssh-command",
        bed.ssh_command,
        "--hostfile",
        str(hostfile),
        "--mpirun",
        mpi.mpirun,
        *args,
    ]


def hostfile(tmp_path, *hosts, slots=2):
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{host} slots={slots}\n" for host in hosts))
    return path


def run(bed, hostfile, mpi: Flavour, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv(bed, hostfile, mpi, *args), cwd=REPO, env=mpilaunch_env(), capture_output=True, text=True, timeout=timeout
    )


def start(bed, hostfile, mpi: Flavour, *args) -> subprocess.Popen:
    return subprocess.Popen(
        argv(bed, hostfile, mpi, *args),
        cwd=REPO,
        env=mpilaunch_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def assert_hosts_clean(bed, timeout: float = 5) -> None:
    """Every host as before the job: its sshd alone (no session, agent, daemon or rank), an empty TMPDIR.
    The job's release waited for each ssh to exit; a host's sshd may still be closing its side."""
    left = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {host: bed.leftovers(host) for host in bed.hosts if bed.leftovers(host)}
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"left on the hosts: {left}")
