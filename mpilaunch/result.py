"""What a finished job hands back: value objects shared by every workload and the lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_TIMEOUT = 124
# A worker disappeared: the exec channel's own code for a lost connection
# (the shim's, as ssh's), whatever the workload saw of it.
EXIT_WORKER_LOST = 255


@dataclass
class RankStatus:
    rank: int
    worker: str
    exit_code: int | None  # None: the rank never reported (killed, never started)


@dataclass
class JobResult:
    job_name: str
    exit_code: int
    ranks: list[RankStatus] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # durations (*_s) and "phases" (lifecycle.run_job)
    failure: str | None = None
    output_dir: str | None = None
    placement: dict | None = None  # the verified placement (placement.summary), mpirun jobs

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def timeout_failure(timeout: float | None) -> str:
    return f"the job ran past --timeout {timeout:g}s and was stopped"


def lost_workers_failure(lost: dict[str, str]) -> str:
    """``worker W was lost: its agent was killed by SIGKILL`` (one line per worker)."""
    return "\n".join(f"worker {name} was lost: {why}" for name, why in sorted(lost.items()))
