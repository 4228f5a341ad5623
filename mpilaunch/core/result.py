"""What a finished job hands back: value objects shared by every workload and the lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RankStatus:
    """How one rank ended."""

    rank: int
    worker: str
    exit_code: int | None  # None: the rank's end was not observed (``unobserved`` says why)
    oom_killed: bool = False  # the kernel's OOM killer ended it (its cgroup's count rose as it died)
    # why exit_code is None: "mpirun was stopped by mpilaunch after rank 2 failed", "mpirun never started", ...
    unobserved: str | None = None


@dataclass
class JobResult:
    """How a job ended: its exit code, its ranks, its timings and what failed."""

    job_name: str
    exit_code: int
    ranks: list[RankStatus] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # durations (*_s) and "phases" (lifecycle.run_job)
    failure: str | None = None
    output_dir: str | None = None
    placement: dict | None = None  # the verified placement (placement.summary), mpirun jobs
    report: dict | None = None  # report.json as run_job built it (a detached launcher posts its summary)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def timeout_failure(timeout: float | None) -> str:
    return f"the job ran past --timeout {timeout:g}s and was stopped"


@dataclass(frozen=True)
class LostWorker:
    """A worker that disappeared during the run, as the backend saw it."""

    worker: str
    reason: str  # the backend's words: "Evicted: ...", "OOMKilled (exit 137)", "its agent was killed by SIGKILL"
    where: str | None = None  # "pod P on node N", "container C on host H", "agent pid P on localhost"
    units: str | None = None  # what ran there: "ranks 2-3", "task worker:1"

    def line(self) -> str:
        where = f" ({self.where})" if self.where else ""
        units = f"; {self.units} ran there" if self.units else ""
        return f"worker {self.worker}{where} was lost: {self.reason}{units}"


def lost_workers_failure(lost: list[LostWorker]) -> str:
    """One line per lost worker, in worker order: what the summary and report.json lead with."""
    return "\n".join(w.line() for w in sorted(lost, key=lambda w: w.worker))


def worker_location(facts: dict) -> str | None:
    """Where a worker lived, from the backend's ``describe_workers`` facts (any backend)."""
    host = facts.get("node") or facts.get("host")
    on = f" on {'node ' if facts.get('node') else ''}{host}" if host else ""
    if facts.get("pod"):
        return f"pod {facts['pod']}{on}"
    if facts.get("container"):
        return f"container {facts['container']}{on}"
    if facts.get("pid"):
        return f"agent pid {facts['pid']}{on}"
    return host or None


def number_ranges(numbers) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out, run = [], []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)
