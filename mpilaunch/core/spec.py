"""Value objects: what the user asked for (JobSpec) and what we will build (Plan).

Both are frozen dataclasses validated on construction, with ``to_dict`` so a
plan can be printed by ``--dry-run`` and stored in ``report.json``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from . import artifacts, mpi
from .errors import UsageError
from .orphan import DEFAULT_ORPHAN_TIMEOUT, MIN_ORPHAN_TIMEOUT

LAUNCHERS = ("auto", "local", "cluster")


def mpi_choices() -> tuple[str, ...]:
    """--mpi's values: auto (detected) or a registered flavour (mpi/registry.py)."""
    return ("auto",) + mpi.names()


MODES = ("allreduce", "ps")

# The biggest job mpilaunch plans (docs/usage.md, "Sizing"): per-rank and per-worker
# work (hostfile, rank map, pods, containers) grows with these, and a typo
# such as --np 100000000 must be an error, not an endless plan.
MAX_RANKS = 65536
MAX_WORKERS = 8192

# Validation patterns of user input: always used with fullmatch (``$`` would
# also match before a trailing newline: --name $'ab\n').
# Kubernetes object names and YARN application names both accept this.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?")

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: --on-stall: what a job found hung (--stall-timeout) gets
ON_STALL = ("stop", "report")


def check_duration(option: str, value: float | None, hint: str) -> None:
    """A duration option: a finite number of seconds above 0 (NaN and inf are no durations)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be positive and finite (seconds), got {value:g}", hint)


def check_plan_size(ranks: int, workers: int, asked: str) -> None:
    """The size limits (MAX_RANKS, MAX_WORKERS), checked before any per-rank or per-worker work."""
    if ranks > MAX_RANKS:
        raise UsageError(
            f"{asked} asks for {ranks} ranks; mpilaunch launches at most {MAX_RANKS}",
            f"give at most {MAX_RANKS} ranks (docs/usage.md, 'Sizing')",
        )
    if workers > MAX_WORKERS:
        raise UsageError(
            f"{asked} needs {workers} workers; mpilaunch launches at most {MAX_WORKERS}",
            f"put more ranks on each worker (--slots-per-worker, --gpus-per-node) to stay within "
            f"{MAX_WORKERS} workers (docs/usage.md, 'Sizing')",
        )


def _as_dict(obj) -> dict:
    return dataclasses.asdict(obj)


@dataclass(frozen=True)
class PsOptions:
    """A TensorFlow parameter-server job's task counts and files (``--ps`` and friends)."""

    ps: int = 0
    workers: int = 0
    chief: bool = False
    evaluator: bool = False
    tensorboard: bool = False
    input_path: str | None = None
    output_path: str | None = None
    script: str | None = None
    requirement: str | None = None  # YARN-DTF -r "ps:2,worker:4"


# Where each JobSpec field goes when the job is detached (``--detach``): the in-cluster launcher
# runs the job from a LaunchDescription, and a field it never sees is an option silently dropped
# (--stall-timeout once was). Every field says which of these it is; test_detach_option holds
# every field to it.
CARRIED = "carried"  # reaches the detached launcher unchanged (launch_description.carried_spec)
RESOLVED = "resolved"  # the submitting side resolves it into its own description field (-x values, the name)
SUBMITTING = "submitting"  # spent on the submitting side before the hand-off (the plan, the objects made)
REFUSED = "refused"  # needs this mpilaunch to stay: refused with --detach (its flag named)


def option(default=None, *, detached: str, flag: str | None = None, default_factory=dataclasses.MISSING):
    """A JobSpec field with where it goes when detached (above) and, for a refused one, its flag."""
    metadata = {"detached": detached, "flag": flag}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class JobSpec:
    """Everything the command line asked for, checked, before anything is planned."""

    command: tuple[str, ...] = option(dataclasses.MISSING, detached=CARRIED)
    gpus: int | None = option(detached=SUBMITTING)
    gpus_per_node: int | None = option(detached=SUBMITTING)
    np: int | None = option(detached=SUBMITTING)
    slots_per_worker: int | None = option(detached=SUBMITTING)
    backend: str = option("local", detached=SUBMITTING)
    mpi: str = option("auto", detached=CARRIED)
    mpirun: str | None = option(detached=RESOLVED)  # YARN: this machine's, found here
    env: tuple[str, ...] = option((), detached=RESOLVED)  # -x NAME[=VALUE]; values taken here
    mpi_args: tuple[str, ...] = option((), detached=CARRIED)
    launcher: str = option("auto", detached=SUBMITTING)
    name: str | None = option(detached=RESOLVED)  # the description's job (a generated one if None)
    start_timeout: float = option(300.0, detached=CARRIED)
    timeout: float | None = option(detached=CARRIED)
    # declared hung after this long silent with unchanged stacks
    stall_timeout: float | None = option(detached=CARRIED)
    on_stall: str = option("stop", detached=CARRIED)  # ON_STALL: stop the hung job (EXIT_HUNG), or report it
    # cluster backends: reap the job this long after mpilaunch vanished (the reaper's, made before the hand-off)
    orphan_timeout: float = option(DEFAULT_ORPHAN_TIMEOUT, detached=SUBMITTING)
    # report.json and the ranks' logs are written by the mpilaunch that stays to the end
    output_dir: str | None = option(detached=REFUSED, flag="--output-dir")
    # --output-ranks: the ranks whose lines this terminal shows (rank_filter.py; None: every rank);
    # a detached job has no terminal of this mpilaunch to filter
    output_ranks: tuple[int, ...] | None = option(detached=REFUSED, flag="--output-ranks")
    # --collect GLOB: files out of the workers after the ranks end, into --output-dir or the record
    # (job/artifacts.py), by the mpilaunch that stays to the end: a detached job's launcher has
    # nowhere `mpilaunch logs`/`wait` could fetch them from
    collect: tuple[str, ...] = option((), detached=REFUSED, flag="--collect")
    collect_max_bytes: int = option(artifacts.DEFAULT_MAX_BYTES, detached=REFUSED, flag="--collect-max")
    collect_max_file_bytes: int = option(artifacts.DEFAULT_MAX_FILE_BYTES, detached=REFUSED, flag="--collect-max-file")
    # --timeline FILE: HOROVOD_TIMELINE=FILE for the ranks (added to env), and the file collected
    timeline: str | None = option(detached=REFUSED, flag="--timeline")
    dry_run: bool = option(False, detached=REFUSED, flag="--dry-run")
    bind_gpus: bool = option(False, detached=CARRIED)
    hostfile: str | None = option(detached=SUBMITTING)
    verify: bool = option(True, detached=CARRIED)  # check every rank's placement against the plan
    detach: bool = option(False, detached=CARRIED)  # submit and exit; the cluster's launcher runs the job
    # relaunch mpirun on the same allocation after a lost worker, this many times: the submitting
    # side replaces the workers
    retries: int = option(0, detached=REFUSED, flag="--retries")
    retry_rank_failures: bool = option(
        False, detached=REFUSED, flag="--retry-rank-failures"
    )  # ... and after a rank failure
    mode: str = option("allreduce", detached=CARRIED)
    # the backend's own options (its BackendOptions subclass, backends/<name>/options.py); None: its
    # defaults. They shape the objects made before the hand-off.
    backend_options: object = option(detached=SUBMITTING)
    ps: PsOptions = option(detached=REFUSED, flag="--ps", default_factory=PsOptions)

    def __post_init__(self):
        if not self.command:
            raise UsageError(
                "no command given",
                "put the program after '--', e.g. mpilaunch --np 4 -- python train.py",
            )
        if self.mpi != "auto" and self.mpi not in mpi.FLAVOURS:  # a flavour registered later counts too
            raise UsageError(f"unknown MPI flavour {self.mpi!r}", f"choose one of: {', '.join(mpi_choices())}")
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"unknown launcher {self.launcher!r}", f"choose one of: {', '.join(LAUNCHERS)}")
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", "choose one of: allreduce, ps")
        check_duration(
            "--start-timeout", self.start_timeout, "give the seconds to wait for workers, e.g. --start-timeout 300"
        )
        check_duration(
            "--timeout",
            self.timeout,
            "give the job's wall-clock limit in seconds, e.g. --timeout 3600, or leave it out",
        )
        check_duration(
            "--stall-timeout",
            self.stall_timeout,
            "give the seconds of silence with unchanged stacks that make a job hung, e.g. --stall-timeout 600",
        )
        if self.on_stall not in ON_STALL:
            raise UsageError(f"unknown --on-stall {self.on_stall!r}", f"choose one of: {', '.join(ON_STALL)}")
        if not MIN_ORPHAN_TIMEOUT <= self.orphan_timeout < float("inf"):  # NaN fails too
            raise UsageError(
                f"--orphan-timeout must be a finite number of seconds, at least {MIN_ORPHAN_TIMEOUT:g}; "
                f"got {self.orphan_timeout:g}",
                f"give the seconds the cluster waits for a vanished mpilaunch, e.g. --orphan-timeout "
                f"{DEFAULT_ORPHAN_TIMEOUT:g}",
            )
        self._check_sizes()
        self._check_output_ranks()
        self._check_collect()
        self._check_detach()
        self._check_retries()
        if self.name is not None and not _NAME_RE.fullmatch(self.name):
            raise UsageError(
                f"invalid job name {self.name!r}",
                "use lowercase letters, digits and '-', at most 42 characters, "
                "starting and ending with a letter or digit",
            )
        for item in self.env:
            name = item.split("=", 1)[0]
            if not _ENV_NAME_RE.fullmatch(name):
                raise UsageError(f"invalid -x {item!r}", "use -x NAME or -x NAME=VALUE with a valid variable name")

    def _check_sizes(self) -> None:
        if self.gpus_per_node is not None and self.gpus_per_node < 1:  # 0 must not fall back to the default (8)
            raise UsageError(
                f"--gpus-per-node must be at least 1, got {self.gpus_per_node}",
                "give the GPUs of one worker, e.g. --gpus-per-node 8, or leave it out (discovered, else 8)",
            )
        for option, value in (("--np", self.np), ("--gpus", self.gpus)):
            if value is not None and value > MAX_RANKS:
                check_plan_size(value, 1, f"{option} {value}")

    def _check_output_ranks(self) -> None:
        if self.output_ranks is None:
            return
        if not self.output_ranks or not all(isinstance(r, int) and r >= 0 for r in self.output_ranks):
            raise UsageError(
                f"output_ranks must be rank numbers (0 or more), got {self.output_ranks!r}",
                "give the ranks to show, e.g. --output-ranks 0 or --output-ranks 0-3,8",
            )
        if self.mode == "ps":
            raise UsageError(
                "--output-ranks filters the ranks of mpirun jobs; PS tasks are not ranks",
                "drop --output-ranks (each PS task's lines carry its task name)",
            )

    def _check_collect(self) -> None:
        artifacts.check_globs(self.collect)
        for flag, value in (
            ("--collect-max", self.collect_max_bytes),
            ("--collect-max-file", self.collect_max_file_bytes),
        ):
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"{flag} must be at least 1 byte, got {value!r}", f"e.g. {flag} 1G")
        if self.timeline is None:
            return
        if not self.timeline or "\0" in self.timeline or "\n" in self.timeline:
            raise UsageError(
                f"--timeline takes a file's path in the workers, got {self.timeline!r}",
                "e.g. --timeline timeline.json (relative to the ranks' working directory)",
            )
        if self.mode == "ps":
            raise UsageError("--timeline is Horovod's timeline of mpirun jobs; PS jobs have none", "drop --timeline")
        wanted = f"{artifacts.TIMELINE_ENV}={self.timeline}"
        given = [item for item in self.env if item.split("=", 1)[0] == artifacts.TIMELINE_ENV]
        if given and given != [wanted]:
            raise UsageError(
                f"--timeline {self.timeline} and -x {given[0]} both set {artifacts.TIMELINE_ENV}",
                "drop one of them (--timeline also brings the file back)",
            )
        if not given:  # the ranks get it as -x would give it, on every backend and launcher
            object.__setattr__(self, "env", tuple(self.env) + (wanted,))

    def _check_detach(self) -> None:
        if not self.detach:
            return
        if self.launcher == "local":
            raise UsageError(
                "--detach needs the launcher in the cluster, not --launcher local",
                "drop --launcher local (the cluster launcher is the default)",
            )
        if self.mode == "ps":
            raise UsageError(
                "--detach runs mpirun jobs; PS jobs are driven from this machine", "run the PS job without --detach"
            )
        if self.dry_run:
            raise UsageError("--detach and --dry-run exclude each other", "drop one of them")
        refused = [flag for _, flag, _ in refused_with_detach(self)]
        if refused:
            raise UsageError(
                f"{refused[0]} needs this mpilaunch to stay until the job ends; --detach leaves at once",
                f"drop --detach, or drop {' and '.join(refused)}",
            )

    def _check_retries(self) -> None:
        if self.retries < 0:
            raise UsageError(
                f"--retries must be 0 or more, got {self.retries}",
                "give how many times to relaunch after a lost worker, e.g. --retries 2",
            )
        if self.retry_rank_failures and not self.retries:
            raise UsageError("--retry-rank-failures needs --retries N", "add --retries 1 (or more)")
        if not self.retries:
            return
        if self.mode == "ps":
            raise UsageError(
                "--retries relaunches mpirun jobs, not PS jobs",
                "PS jobs recover through TensorFlow's own fault tolerance; drop --retries",
            )

    def to_dict(self) -> dict:
        return _as_dict(self)


def detached_kind(spec_field: dataclasses.Field) -> str:
    return spec_field.metadata["detached"]


def refused_with_detach(spec: JobSpec) -> list[tuple[str, str, object]]:
    """(field, flag, value) of each option given that a detached job cannot honour."""
    out = []
    for spec_field in dataclasses.fields(spec):
        if detached_kind(spec_field) != REFUSED:
            continue
        default = (
            spec_field.default_factory()
            if spec_field.default_factory is not dataclasses.MISSING
            else spec_field.default
        )
        value = getattr(spec, spec_field.name)
        if value != default:
            out.append((spec_field.name, spec_field.metadata["flag"], value))
    return out


@dataclass(frozen=True)
class WorkerPlan:
    """One worker of the plan: its name, MPI slots and GPUs."""

    name: str
    slots: int
    gpus: int  # GPUs this worker requests (0 for CPU-only jobs)


@dataclass(frozen=True)
class Plan:
    """The job's workers, as sized from the command line."""

    job_name: str
    workers: tuple[WorkerPlan, ...]

    def __post_init__(self):
        if not self.workers:
            raise ValueError("a plan needs at least one worker")
        check_plan_size(self.ranks, len(self.workers), f"the plan of job {self.job_name}")

    @property
    def ranks(self) -> int:
        return sum(w.slots for w in self.workers)

    @property
    def gpus(self) -> int:
        return sum(w.gpus for w in self.workers)

    @property
    def slots_per_worker(self) -> int:
        return max(w.slots for w in self.workers)

    def rank_to_worker(self) -> list[str]:
        """Rank i -> worker name, as ``-map-by slot`` fills the hostfile in order."""
        out: list[str] = []
        for w in self.workers:
            out.extend([w.name] * w.slots)
        return out

    def to_dict(self) -> dict:
        return {
            "job_name": self.job_name,
            "ranks": self.ranks,
            "gpus": self.gpus,
            "workers": [_as_dict(w) for w in self.workers],
        }
