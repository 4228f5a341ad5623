"""The interface of a workload: what runs on the allocated workers and how its end is judged.

The lifecycle (``lifecycle.py``) owns the steps every job goes through
(allocate -> wait until ready -> start -> watch -> collect -> release); a
workload fills in the steps that differ between an mpirun job and a PS job.
It never allocates or releases anything itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..core.result import JobResult
from ..core.spec import JobSpec, Plan

SHIM_NAME = "mpilaunch-rsh"


@dataclass
class RunContext:
    """Everything a running workload may use; built by the lifecycle once workers are ready."""

    spec: JobSpec
    backend: object
    rundir: Path
    context_file: Path  # the shim's context file (job + backend.exec_context())
    output_dir: Path | None
    environ: dict
    stdout: object
    stderr: object
    quiet: bool
    result: JobResult


class Workload(ABC):
    mode: str = "base"
    # whether the backend may run this workload's driver in the cluster (a launcher pod/container):
    # mpirun can; a PS job's registry is this mpilaunch itself, so its backend keeps everything here
    can_use_cluster_launcher: bool = True
    # --retries: which run of the workload this is (bind's; a relaunched launcher starts at its own)
    attempt: int = 1

    def __init__(self, spec: JobSpec, job_name: str, plan: Plan):
        self.spec = spec
        self.job_name = job_name
        self.plan = plan  # the backend's view: which workers, how many slots

    def bind(self, backend, rundir: Path, environ: dict) -> None:
        """Called once the backend object exists (before anything is allocated)."""

    @abstractmethod
    def print_dry_run(self, backend, environ: dict, stream) -> None:
        """The plan and the exact commands, creating nothing."""

    @abstractmethod
    def waiting_for(self) -> str:
        """What the progress line says while the backend brings the workers up."""

    def check_program(self, run: RunContext) -> None:
        """Once the workers are ready, before start: raise UsageError where the program cannot
        start on them (known then, not before). Nothing by default."""

    @abstractmethod
    def start(self, run: RunContext) -> None:
        """Start the workload on the ready workers (may raise AllocationError)."""

    @abstractmethod
    def watch(self, run: RunContext, deadline: float | None) -> tuple[int, str | None]:
        """Block until the job's outcome is decided: (exit code, failure text or None)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop whatever still runs. Idempotent; called on every exit path."""

    def note_stop(self, why: str, broken: bool = False) -> None:
        """Why the next ``stop()`` comes ("after worker W was lost"), for what the report says of
        units whose end it cuts off (mpirun jobs: ``ranks[].unobserved``). ``broken``: the run
        cannot go on (a worker is gone), so the stop need not wait long for a graceful end."""

    def close(self) -> None:
        """Close logs once everything has stopped."""

    def reset(self, attempt: int) -> None:
        """Forget a stopped attempt so ``start`` can run attempt number ``attempt`` on the same workers (``--retries``)."""
        raise NotImplementedError(f"{self.mode} jobs cannot be relaunched")

    @abstractmethod
    def collect(self, run: RunContext) -> None:
        """Per-unit statuses into ``run.result`` (after stop, release and close)."""

    @abstractmethod
    def report(self, run: RunContext, workers: dict) -> dict:
        """The content of report.json."""

    def phase_times(self) -> dict[str, float]:
        """Phases this workload saw (``phases.py``: name -> time.monotonic()), merged into report.json."""
        return {}

    def units_on(self, worker: str) -> str | None:
        """What ran on a worker, for the lost-worker line: ``ranks 2-3``, ``task worker:1``."""
        return None

    def all_units_reported(self) -> bool:
        """Whether every unit's own end was observed (a success needs no other witness)."""
        return True


def shim_path(rundir: Path) -> str:
    """The shim mpirun will call: a per-job launcher that starts Python with -IS.

    mpirun starts one shim per worker; skipping ``site`` keeps each start near
    the bare interpreter's cost (site-packages .pth files can add tens of ms).
    """
    from ..rsh_agent.shim import write_launcher

    return write_launcher(str(rundir / SHIM_NAME))


#: on a terminal --dry-run shows this much of a manifest's line (the job's zipped pieces are
#: ~300 KB of base64); into a file or pipe (and `mpilaunch render`) every line goes whole
SHOWN_LINE = 300


def print_manifests(backend, stream) -> None:
    if backend.capabilities.render:
        print("manifests:", file=stream)
        shorten = getattr(stream, "isatty", lambda: False)()
        for line in backend.render().splitlines():
            if shorten and len(line) > SHOWN_LINE:
                line = f"{line[:SHOWN_LINE]}... ({len(line) - SHOWN_LINE} more characters; mpilaunch render shows all)"
            print(line, file=stream)
