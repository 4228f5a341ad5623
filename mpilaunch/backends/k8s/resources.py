"""Requests and limits of the pods mpilaunch adds to a job: the launcher and the reaper (pure).

A namespace with a ResourceQuota on ``limits.*`` refuses a container without
limits, and a LimitRange may set a minimum (commonly ``cpu: 50m``) and a
maximum limit/request ratio. Every container here therefore has requests
equal to its limits: the ratio is 1, whatever the LimitRange allows, and the
pod is in the Guaranteed QoS class (the last to be evicted).

The launcher's memory is sized from the job: with direct spawn (the
default, ``plm_rsh_no_tree_spawn``) it holds mpirun and one shim process per
worker for the whole run: measured 56 MiB + 4.9 MiB per worker charged (BENCHMARKS.md,
"Launcher memory"); the default is 256 MiB + 12 MiB per worker, 2.5-3.5x that.
"""

from __future__ import annotations

import math

LAUNCHER_CPU = "500m"  # mpirun and its shims; a CPU limit any quota admits on small nodes
LAUNCHER_BASE_MIB = 256  # mpirun, the launcher's Python, the output relay
# one mpilaunch-rsh per worker: 15 MiB RSS, of it ~5 MiB its own (the rest shared pages, which a
# cgroup charges once; BENCHMARKS.md "Launcher memory": ~4.9 MiB charged per worker, 16-256 workers)
SHIM_MIB = 12
REAPER_CPU = "50m"  # the usual LimitRange minimum; the reaper sleeps on a watch
REAPER_MEMORY = "128Mi"


def launcher_memory_mib(workers: int) -> int:
    """256 MiB plus 12 MiB per worker, rounded up to a multiple of 64 MiB."""
    return int(math.ceil((LAUNCHER_BASE_MIB + SHIM_MIB * workers) / 64.0) * 64)


def guaranteed(cpu: str, memory: str) -> dict:
    both = {"cpu": cpu, "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def launcher_resources(workers: int, cpu: str | None, memory: str | None) -> dict:
    return guaranteed(cpu or LAUNCHER_CPU, memory or f"{launcher_memory_mib(workers)}Mi")


def reaper_resources(cpu: str | None, memory: str | None) -> dict:
    return guaranteed(cpu or REAPER_CPU, memory or REAPER_MEMORY)


def worker_resources(cpu: str | None, memory: str | None, gpus: int, gpu_resource: str) -> dict:
    """--pod-cpu / --pod-memory: request = limit; GPUs are limits only (the scheduler copies them to
    requests). Empty when none is given: the namespace's LimitRange defaults apply."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    limits = dict(requests)
    if gpus:
        limits[gpu_resource] = gpus
    out = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out
