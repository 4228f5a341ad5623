"""What a finished job hands back: value objects shared by every workload and the lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_TIMEOUT = 124


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
    timings: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    output_dir: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def timeout_failure(timeout: float | None) -> str:
    return f"the job ran past --timeout {timeout:g}s and was stopped"
