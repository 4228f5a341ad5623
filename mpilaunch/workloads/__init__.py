"""What runs on the workers: an mpirun over every slot, or one TensorFlow task per container."""

from __future__ import annotations

from ..core.spec import JobSpec


def workload_class(spec: JobSpec):
    """The workload of a spec's mode (imported lazily: PS mode pulls no MPI code, and back)."""
    if spec.mode == "ps":
        from .ps import PsWorkload

        return PsWorkload
    from .mpirun import MpirunWorkload

    return MpirunWorkload
