"""The local backend's options: none of its own (``--hostfile`` is the job's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import BackendOptions


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    """The local backend's options (it has none of its own)."""

    backend_class = "mpilaunch.backends.local.backend:LocalBackend"

    @classmethod
    def discover_gpus_per_node(cls, spec) -> int | None:
        from ...core import gpu_slots

        return len(gpu_slots.discover_local_gpus()) or None
