"""GPUs -> workers x slots, and slot -> GPU device mapping.

Sizing is pure; discovery asks ``nvidia-smi`` (the one tool every GPU node
has) and honours an existing ``CUDA_VISIBLE_DEVICES`` the way CUDA does.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass

from .errors import UsageError
from .spec import Plan, WorkerPlan, check_plan_size

DEFAULT_GPUS_PER_NODE = 8


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def _divisor_choices(n: int, limit: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and d <= limit] or [1]


def size_gpu_job(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """Total GPUs -> (workers, GPUs per worker). One rank per GPU."""
    if gpus < 1:
        raise UsageError(
            f"--gpus must be at least 1, got {gpus}",
            "give the total number of GPUs (= MPI ranks), e.g. --gpus 8; for CPU-only jobs use --np",
        )
    if gpus_per_node < 1:
        raise UsageError(
            f"--gpus-per-node must be at least 1, got {gpus_per_node}",
            "give the GPUs of one worker, e.g. --gpus-per-node 8",
        )
    if gpus <= gpus_per_node:
        check_plan_size(gpus, 1, f"--gpus {gpus}")
        return 1, gpus
    if gpus % gpus_per_node == 0:
        check_plan_size(gpus, gpus // gpus_per_node, f"--gpus {gpus} with --gpus-per-node {gpus_per_node}")
        return gpus // gpus_per_node, gpus_per_node
    lower = gpus - gpus % gpus_per_node
    upper = lower + gpus_per_node
    divisors = ", ".join(str(d) for d in _divisor_choices(gpus, gpus_per_node))
    raise UsageError(
        f"--gpus {gpus} is not a multiple of --gpus-per-node {gpus_per_node}",
        f"use --gpus {lower} or --gpus {upper} (or up to {gpus_per_node}), "
        f"or a --gpus-per-node that divides {gpus}: {divisors}",
    )


def size_cpu_job(np: int, slots_per_worker: int | None) -> tuple[int, list[int]]:
    """--np N [--slots-per-worker S] -> (workers, slots of each worker)."""
    if np < 1:
        raise UsageError(f"--np must be at least 1, got {np}", "give the number of MPI ranks, e.g. --np 4")
    if slots_per_worker is None:
        slots_per_worker = np
    if slots_per_worker < 1:
        raise UsageError(
            f"--slots-per-worker must be at least 1, got {slots_per_worker}",
            "give the ranks per worker, e.g. --slots-per-worker 2",
        )
    workers = math.ceil(np / slots_per_worker)
    check_plan_size(np, workers, f"--np {np}" + (f" with --slots-per-worker {slots_per_worker}" if workers > 1 else ""))
    slots = [slots_per_worker] * workers
    slots[-1] = np - slots_per_worker * (workers - 1)
    return workers, slots


def plan_job(
    job_name: str,
    *,
    gpus: int | None,
    gpus_per_node: int | None,
    np: int | None,
    slots_per_worker: int | None,
    discovered_gpus_per_node: int | None = None,
) -> Plan:
    """Build the worker plan from the sizing options of the contract."""
    if gpus is not None and np is not None:
        raise UsageError("--gpus and --np are mutually exclusive", "use --gpus for GPU jobs, --np for CPU-only jobs")
    if gpus is None and np is None:
        raise UsageError("say how big the job is", "give --gpus N (one rank per GPU) or --np N (CPU ranks)")
    if gpus is not None:
        if slots_per_worker is not None:
            raise UsageError(
                "--slots-per-worker only applies to --np jobs",
                "with --gpus, the slots of a worker are its GPUs: use --gpus-per-node",
            )
        # `is not None`: an explicit --gpus-per-node 0 is an error (size_gpu_job), never the default
        per_node = gpus_per_node if gpus_per_node is not None else (discovered_gpus_per_node or DEFAULT_GPUS_PER_NODE)
        count, per_worker = size_gpu_job(gpus, per_node)
        workers = tuple(WorkerPlan(worker_name(job_name, i), slots=per_worker, gpus=per_worker) for i in range(count))
    else:
        if gpus_per_node is not None:
            raise UsageError("--gpus-per-node only applies to --gpus jobs", "use --slots-per-worker with --np")
        count, slots = size_cpu_job(np, slots_per_worker)
        workers = tuple(WorkerPlan(worker_name(job_name, i), slots=s, gpus=0) for i, s in enumerate(slots))
    return Plan(job_name=job_name, workers=workers)


# ---------------------------------------------------------------- discovery


@dataclass(frozen=True)
class GpuDiscovery:
    """What a backend learnt of the GPUs a job may use, while planning (``--gpus`` without
    ``--gpus-per-node``)."""

    per_node: int | None = None  # the most GPUs of one node; None: unknown (DEFAULT_GPUS_PER_NODE is assumed)
    total: int | None = None  # allocatable GPUs over every node listed; None: no list
    nodes: int | None = None  # how many nodes were listed
    resource: str = "GPUs"  # what was counted (k8s: --gpu-resource)
    where: str = ""  # which nodes count, as the user chose them (" with --node-selector type=gpu")
    unknown_why: str | None = None  # why the cluster could not tell: the fallback is stated (fallback_warning)


def fallback_warning(discovery: GpuDiscovery) -> str | None:
    """The one line that says the default was assumed because the cluster would not say."""
    if discovery.per_node is not None or discovery.unknown_why is None:
        return None
    return (
        f"mpilaunch: warning: {discovery.unknown_why}: assuming {DEFAULT_GPUS_PER_NODE} GPUs per node; "
        f"give --gpus-per-node G if the nodes have another number"
    )


def check_capacity(gpus: int, discovery: GpuDiscovery) -> None:
    """Refuse, before anything is allocated, a job asking for more GPUs than the nodes discovery
    listed have in all: it would only wait out --start-timeout. (A cluster that adds nodes on
    demand can hold more than it lists: --gpus-per-node skips discovery and this check.)"""
    if discovery.total is None or gpus <= discovery.total:
        return
    nodes = f"{discovery.nodes} node{'s' if discovery.nodes != 1 else ''}"
    fewer = f"ask for at most {discovery.total} (--gpus)" if discovery.total else "check --gpu-resource"
    raise UsageError(
        f"--gpus {gpus} asks for more {discovery.resource} than the cluster has: its {nodes}"
        f"{discovery.where} have {discovery.total} allocatable in all",
        f"{fewer}; where nodes are added on demand (a cluster autoscaler), give --gpus-per-node G, "
        "which skips this check",
    )


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES -> device ids, None when unset (all visible)."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "-1", "none", "NoDevFiles"):
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_nvidia_smi_indices(output: str) -> list[str]:
    """Output of ``nvidia-smi --query-gpu=index --format=csv,noheader``."""
    return [line.strip() for line in output.splitlines() if line.strip().isdigit()]


def discover_local_gpus(environ: dict | None = None) -> list[str]:
    """GPU ids usable by this process: nvidia-smi's list filtered by CUDA_VISIBLE_DEVICES."""
    environ = os.environ if environ is None else environ
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return visible or []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return visible or []
    physical = parse_nvidia_smi_indices(out)
    if visible is None:
        return physical
    # CUDA_VISIBLE_DEVICES may name UUIDs; keep those as given.
    return [d for d in visible if d in physical or not d.isdigit()]


def partition_devices(devices: list[str], plan: Plan, spares=()) -> dict[str, list[str]]:
    """Give each worker of a local job its own GPUs, in order, then each spare (``WorkerPlan``)."""
    needed = plan.gpus
    if needed > len(devices):
        raise UsageError(
            f"the job needs {needed} GPUs but this machine has {len(devices)} usable"
            + (f" ({','.join(devices)})" if devices else ""),
            "lower --gpus, or check nvidia-smi and CUDA_VISIBLE_DEVICES",
        )
    for_spares = sum(s.gpus for s in spares)
    if needed + for_spares > len(devices):
        raise UsageError(
            f"the job needs {needed} GPUs and its {len(spares)} spares {for_spares} more, "
            f"but this machine has {len(devices)} usable",
            "lower --spares (each spare takes the GPUs of one worker)",
        )
    out: dict[str, list[str]] = {}
    cursor = 0
    for w in (*plan.workers, *spares):
        out[w.name] = devices[cursor : cursor + w.gpus]
        cursor += w.gpus
    return out


def rank_device(local_rank: int, devices: list[str]) -> str:
    """Slot -> GPU: local rank i of a worker gets the worker's i-th GPU."""
    return devices[local_rank % len(devices)]
