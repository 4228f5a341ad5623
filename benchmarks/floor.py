"""The cost floor of any exec-based launch, shared by the benchmarks.

A one-line ``/bin/sh`` rsh agent that runs the daemon command locally: what a
fake-host launch costs with no exec channel at all. The floor's mpirun gets
the same flags, hostfile layout and rank count as mpilaunch's (it is built by
the same ``mpi.build_mpirun``), minus the per-rank wrapper.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mpilaunch.core import (  # noqa: E402
    hostfile,
    mpi,
)

# Each fake host gets a private TMPDIR and shared-memory directory, as real
# hosts (and mpilaunch's agents) have: sharing them crashes Open MPI.
# Same for Open MPI 5's coll/han, which misreads the topology (see agent.py).
SH_AGENT = """#!/bin/sh
# rsh agent floor: run the daemon here, in the fake host's private dirs
d="{base}/$1"; shift
mkdir -p "$d"
export TMPDIR="$d" OMPI_MCA_btl_vader_backing_directory="$d" OMPI_MCA_btl_sm_backing_directory="$d"
export OMPI_MCA_coll="^han"  # as mpilaunch's agent does for hosts sharing one machine
exec /bin/sh -c "$*"
"""


def write_sh_agent(directory: Path) -> str:
    path = directory / "sh-agent"
    path.write_text(SH_AGENT.format(base=directory / "hosts"))
    path.chmod(0o755)
    return str(path)


def floor_command(
    info: mpi.MpiInfo,
    directory: Path,
    workers: int,
    slots: int,
    command: list[str],
    extra_args: tuple[str, ...] = (),
    name: str = "floor",
) -> mpi.MpirunCommand:
    """The floor's mpirun: mpilaunch's flags (``build_mpirun``, and for Open MPI the
    ``tune_launch`` that ``workloads.mpirun_command.build_launch`` applies), ``extra_args`` as
    ``--mpi-args`` would give them, hosts named ``<name>-worker-<i>`` like local workers."""
    hosts = [(f"{name}-worker-{i}", slots) for i in range(workers)]
    hf = directory / "floor-hostfile"
    hf.write_text(hostfile.render(hosts, info.hostfile_flavour))
    program = list(command)
    command = mpi.build_mpirun(
        info,
        ranks=workers * slots,
        hosts=workers,
        hostfile=str(hf),
        shim=write_sh_agent(directory),
        command=program,
        environ=dict(os.environ),
        as_root=os.geteuid() == 0,
        extra_args=tuple(extra_args),
    )
    mpi.for_name(info.flavour).tune_launch(info, command, tuple(extra_args), len(program))
    if info.flavour == "intel":
        # Intel's own setup (vars.sh) puts <prefix>/lib on LD_LIBRARY_PATH; without it
        # libmpi loads whatever libfabric.so.1 the system has (seen: Debian's 1.17
        # instead of Intel's 2.4, at a quarter of the bandwidth), not a fair floor.
        old = os.environ.get("LD_LIBRARY_PATH")
        command.env["LD_LIBRARY_PATH"] = info.libdir + (":" + old if old else "")
    return command


def compare_to_floor(
    benchmark: str, info: mpi.MpiInfo, ours: list[float], base: list[float], target: float, digits: int = 3, **extra
) -> dict:
    """The JSON result every floor benchmark prints: medians of both sides and their ratio."""
    result = {
        "benchmark": benchmark,
        "mpi": f"{info.flavour} {info.version}",
        "runs": len(ours),
        **extra,
        "mpilaunch_median_s": round(statistics.median(ours), digits),
        "floor_median_s": round(statistics.median(base), digits),
    }
    result["ratio"] = round(result["mpilaunch_median_s"] / result["floor_median_s"], 2)
    result["target_ratio"] = target
    return result
