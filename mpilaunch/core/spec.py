"""Value objects: what the user asked for (JobSpec) and what we will build (Plan).

Both are frozen dataclasses validated on construction, with ``to_dict`` so a
plan can be printed by ``--dry-run`` and stored in ``report.json``. Each
JobSpec and PsOptions field is a run option declared once (``option``,
core/declared.py): its flag, type, default, help and place in a detached job;
the parser and ``from_args`` are made from the declarations.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from . import artifacts, env_names, mpi
from .declared import CARRIED, REFUSED, RESOLVED, SUBMITTING, detached_kind, option, refused_with_detach
from .errors import UsageError
from .exit_codes import EXIT_HUNG, EXIT_PREFLIGHT
from .limits import MAX_RANKS, MAX_WORKERS
from .orphan import DEFAULT_ORPHAN_TIMEOUT, MIN_ORPHAN_TIMEOUT
from .ps_options import PS_GROUP, PsOptions, implied_mode
from .rank_filter import parse_rank_list

__all__ = [
    "CARRIED",
    "REFUSED",
    "RESOLVED",
    "SUBMITTING",
    "MAX_RANKS",
    "MAX_WORKERS",
    "PS_GROUP",
    "PsOptions",
    "detached_kind",
    "option",
]

LAUNCHERS = ("auto", "local", "cluster")


def mpi_choices() -> tuple[str, ...]:
    """--mpi's values: auto (detected) or a registered flavour (mpi/registry.py)."""
    return ("auto",) + mpi.names()


MODES = ("allreduce", "ps")

# Validation patterns of user input: always used with fullmatch (``$`` would
# also match before a trailing newline: --name $'ab\n').
# Kubernetes object names and YARN application names both accept this.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?")

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: --on-stall: what a job found hung (--stall-timeout) gets
ON_STALL = ("stop", "report")
#: --preflight: no checks, checks that report, checks that stop the job before its program
PREFLIGHT = ("off", "report", "enforce")


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


# The option groups of `mpilaunch run --help`, in this order (the backends' groups come before PS_GROUP)
SIZING, BACKEND_AND_MPI, JOB_CONTROL, ARTIFACTS = "sizing", "backend and MPI", "job control", "artifacts"


def split_mpi_args(text: str) -> tuple[str, ...]:
    """--mpi-args "...": split like a shell would; an unbalanced quote is bad input, not a traceback."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as e:  # "No closing quotation", "No escaped character"
        raise UsageError(
            f"cannot split --mpi-args {text!r}: {str(e)[:1].lower()}{str(e)[1:]}",
            "quote --mpi-args as one shell word and balance the quotes inside it, "
            "e.g. --mpi-args '--mca btl \"tcp,self\"'",
        ) from None


def default_backend() -> str:
    import os

    return os.environ.get(env_names.BACKEND, "local")


@dataclass(frozen=True)
class JobSpec:
    """Everything the command line asked for, checked, before anything is planned.

    Each field is an option (``option``: its flag, help and ``detached=`` place, CARRIED,
    RESOLVED, SUBMITTING or REFUSED: core/declared.py), in the order of ``--help``."""

    command: tuple[str, ...] = option(dataclasses.MISSING, detached=CARRIED)  # what follows '--'
    # sizing
    gpus: int | None = option(
        flag="--gpus", type=int, group=SIZING, detached=SUBMITTING, help="total GPUs = MPI ranks, one rank per GPU"
    )
    gpus_per_node: int | None = option(
        flag="--gpus-per-node",
        type=int,
        group=SIZING,
        detached=SUBMITTING,
        help="GPUs per worker (default: discovered, else 8)",
    )
    np: int | None = option(flag="--np", type=int, group=SIZING, detached=SUBMITTING, help="ranks for CPU-only jobs")
    slots_per_worker: int | None = option(
        flag="--slots-per-worker",
        type=int,
        group=SIZING,
        detached=SUBMITTING,
        help="spread --np ranks over ceil(N/S) workers",
    )
    hostfile: str | None = option(
        flag="--hostfile",
        group=SIZING,
        detached=SUBMITTING,
        help="local and ssh backends: take worker names and slots (ssh: the hosts) from this hostfile",
    )
    bind_gpus: bool = option(
        False,
        flag="--bind-gpus",
        group=SIZING,
        detached=CARRIED,
        help="each rank sees only its own GPU (off: Horovod picks local_rank itself)",
    )
    # backend and MPI
    backend: str = option(
        "local",
        flag="--backend",
        parser_default=default_backend,
        group=BACKEND_AND_MPI,
        detached=SUBMITTING,
        help=lambda context: f"one of {', '.join(context['backends'])} (default: local or ${env_names.BACKEND})",
    )
    mpi: str = option(
        "auto",
        flag="--mpi",
        group=BACKEND_AND_MPI,
        detached=CARRIED,
        help=lambda context: f"one of {', '.join(mpi_choices())}",  # flavours registered later count too
    )
    mpirun: str | None = option(
        flag="--mpirun", group=BACKEND_AND_MPI, detached=RESOLVED, help="path of the mpirun to use"
    )  # YARN: this machine's, found here
    env: tuple[str, ...] = option(
        (),
        flag="-x",
        action="append",
        metavar="NAME[=VALUE]",
        group=BACKEND_AND_MPI,
        detached=RESOLVED,  # values taken here
        help="export a variable to every rank (repeatable)",
    )
    mpi_args: tuple[str, ...] = option(
        (),
        flag="--mpi-args",
        type=split_mpi_args,
        group=BACKEND_AND_MPI,
        detached=CARRIED,
        help="extra arguments for mpirun, as one string",
    )
    launcher: str = option(
        "auto",
        flag="--launcher",
        group=BACKEND_AND_MPI,
        detached=SUBMITTING,
        help=f"where mpirun runs: one of {', '.join(LAUNCHERS)}",
    )
    # job control
    name: str | None = option(
        flag="--name", group=JOB_CONTROL, detached=RESOLVED, help="job name (default: generated)"
    )  # the description's job (a generated one if None)
    start_timeout: float = option(
        300.0,
        flag="--start-timeout",
        type=float,
        group=JOB_CONTROL,
        detached=CARRIED,
        help="seconds to wait for all workers (default 300)",
    )
    timeout: float | None = option(
        flag="--timeout", type=float, group=JOB_CONTROL, detached=CARRIED, help="wall-clock limit of the run in seconds"
    )
    stall_timeout: float | None = option(
        flag="--stall-timeout",
        type=float,
        metavar="SEC",
        group=JOB_CONTROL,
        detached=CARRIED,
        help="declare the job hung when no rank printed anything and every rank's stacks stayed the "
        "same this long: the verdict names the rank(s) holding it up",
    )
    on_stall: str = option(
        "stop",
        flag="--on-stall",
        choices=ON_STALL,
        group=JOB_CONTROL,
        detached=CARRIED,
        help=f"a hung job: stop it (exit {EXIT_HUNG}, default) or report it and let it run on",
    )
    preflight: str = option(
        "off",
        flag="--preflight",
        choices=PREFLIGHT,
        group=JOB_CONTROL,
        detached=CARRIED,
        help="check the job's workers before its program starts (GPUs, scratch space, clock, a timed "
        "compute kernel against the other workers): 'report' names a failing or slow worker, 'enforce' "
        f"also stops the job before its program (exit {EXIT_PREFLIGHT}); default off",
    )
    preflight_margin: float = option(
        0.5,
        flag="--preflight-margin",
        type=float,
        metavar="FRACTION",
        group=JOB_CONTROL,
        detached=CARRIED,
        help="--preflight names a worker this much slower than the median (default 0.5: 50%%)",
    )
    straggler_report: float | None = option(
        flag="--straggler-report",
        type=float,
        metavar="SEC",
        group=JOB_CONTROL,
        detached=CARRIED,
        help="sample every rank's stacks every SEC seconds (e.g. 30) while the job runs and name, at its "
        "end, the rank the others most often waited for in MPI, with where it was",
    )
    # cluster backends: reap the job this long after mpilaunch vanished (the reaper's, made before the hand-off)
    orphan_timeout: float = option(
        DEFAULT_ORPHAN_TIMEOUT,
        flag="--orphan-timeout",
        type=float,
        metavar="SEC",
        group=JOB_CONTROL,
        detached=SUBMITTING,
        help="k8s/yarn: the cluster ends the job when this mpilaunch has been gone (killed, "
        f"disconnected) for SEC seconds (default {DEFAULT_ORPHAN_TIMEOUT:g})",
    )
    detach: bool = option(
        False,
        flag="--detach",
        group=JOB_CONTROL,
        detached=CARRIED,
        help="submit, print the job's name and how to follow it, and exit 0 (cluster backends)",
    )
    # relaunch mpirun on the same allocation after a lost worker, this many times: the submitting
    # side replaces the workers
    retries: int = option(
        0,
        flag="--retries",
        type=int,
        metavar="N",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="after a lost worker, replace it and relaunch mpirun on the same allocation, up to N times",
    )
    retry_rank_failures: bool = option(
        False,
        flag="--retry-rank-failures",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="with --retries: relaunch after a rank failure too",
    )
    # warm workers beyond the plan (local: outside the hostfile; ssh: its next hosts): a worker --preflight
    # enforce rejects, or one lost with --retries, is replaced from them at once (backends/spare_pool.py)
    spares: int = option(
        0,
        flag="--spares",
        type=int,
        metavar="K",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="K more workers (ssh: the hostfile's next K hosts): one takes the place of a worker that --preflight enforce rejects or --retries replaces (every backend)",
    )
    # report.json and the ranks' logs are written by the mpilaunch that stays to the end
    output_dir: str | None = option(
        flag="--output-dir",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="write one log per rank and report.json here",
    )
    # the ranks whose lines this terminal shows (rank_filter.py; None: every rank); a detached job
    # has no terminal of this mpilaunch to filter
    output_ranks: tuple[int, ...] | None = option(
        flag="--output-ranks",
        type=parse_rank_list,
        metavar="LIST",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="show only these ranks' lines on the terminal, e.g. 0 or 0-3,8 (every rank still goes to "
        "its --output-dir log; mpilaunch's own lines always show)",
    )
    # --collect GLOB: files out of the workers after the ranks end, into --output-dir or the record
    # (runtime/artifacts.py), by the mpilaunch that stays to the end: a detached job's launcher has
    # nowhere `mpilaunch logs`/`wait` could fetch them from
    collect: tuple[str, ...] = option(
        (),
        flag="--collect",
        action="append",
        metavar="GLOB",
        group=ARTIFACTS,
        detached=REFUSED,
        help="after the ranks end (also when they failed, timed out or hung), copy the files matching GLOB "
        "(relative to the ranks' working directory, or absolute) from each worker into --output-dir "
        "(else the job's record) under files/WORKER/ (repeatable)",
    )
    collect_max_bytes: int = option(
        artifacts.DEFAULT_MAX_BYTES,
        flag="--collect-max",
        type=lambda text: artifacts.parse_size("--collect-max", text),
        parser_default="1G",  # a string: argparse passes it through type, and --help shows it as typed
        metavar="SIZE",
        group=ARTIFACTS,
        detached=REFUSED,
        help=f"bring back at most SIZE in all, e.g. 1G (default {artifacts.format_size(artifacts.DEFAULT_MAX_BYTES)})",
    )
    collect_max_file_bytes: int = option(
        artifacts.DEFAULT_MAX_FILE_BYTES,
        flag="--collect-max-file",
        type=lambda text: artifacts.parse_size("--collect-max-file", text),
        parser_default="512M",
        metavar="SIZE",
        group=ARTIFACTS,
        detached=REFUSED,
        help=f"skip a file bigger than SIZE (default {artifacts.format_size(artifacts.DEFAULT_MAX_FILE_BYTES)})",
    )
    # --timeline FILE: HOROVOD_TIMELINE=FILE for the ranks (added to env), and the file collected
    timeline: str | None = option(
        flag="--timeline",
        metavar="FILE",
        group=ARTIFACTS,
        detached=REFUSED,
        help="Horovod's timeline: HOROVOD_TIMELINE=FILE for the ranks (a path in the workers), and the file "
        "brought back as --collect does (horovodrun --timeline-filename)",
    )
    dry_run: bool = option(
        False,
        flag="--dry-run",
        group=JOB_CONTROL,
        detached=REFUSED,
        help="print the plan, hostfile, mpirun command and environment; create nothing",
    )
    verify: bool = option(
        True,
        flag="--no-verify",
        group=JOB_CONTROL,
        detached=CARRIED,
        help="skip the placement check (every rank on its planned worker, np ranks in all)",
    )
    # parameter-server mode
    mode: str = option(
        "allreduce",
        flag="--mode",
        parser_default=None,
        from_args=implied_mode,
        group=PS_GROUP,
        detached=CARRIED,
        help="allreduce (default) or ps (implied by -r, --ps, --workers, --chief, --evaluator or --tensorboard)",
    )
    ps: PsOptions = option(detached=REFUSED, flag="--ps", nested=PsOptions, default_factory=PsOptions)
    # the backend's own options (its BackendOptions subclass, backends/<name>/options.py); None: its
    # defaults. They shape the objects made before the hand-off; each of their fields declares its own place.
    backend_options: object = option(detached=SUBMITTING)

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
        check_duration("--straggler-report", self.straggler_report, "give the seconds between stack samples, e.g. 30")
        if self.preflight not in PREFLIGHT:
            raise UsageError(f"unknown --preflight {self.preflight!r}", f"choose one of: {', '.join(PREFLIGHT)}")
        if not (math.isfinite(self.preflight_margin) and self.preflight_margin > 0):
            margin = f"--preflight-margin must be a positive fraction, got {self.preflight_margin:g}"
            raise UsageError(margin, "give how much slower than the median names a worker, e.g. 0.5 (50%)")
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
        for flag, value in (("--np", self.np), ("--gpus", self.gpus)):
            if value is not None and value > MAX_RANKS:
                check_plan_size(value, 1, f"{flag} {value}")

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
        if self.spares < 0:
            raise UsageError(
                f"--spares must be 0 or more, got {self.spares}", "give how many spare workers, e.g. --spares 1"
            )
        if self.spares and self.mode == "ps":
            raise UsageError(
                "--spares stands in for mpirun workers, not PS tasks",
                "drop --spares; PS jobs recover through TensorFlow's own fault tolerance",
            )
        if self.spares and not (self.retries or self.preflight == "enforce"):
            raise UsageError(
                "--spares needs something to swap a worker out: --retries N (a lost worker) or --preflight enforce",
                "add --retries 1 or --preflight enforce, or drop --spares",
            )
        if not self.retries:
            return
        if self.mode == "ps":
            raise UsageError(
                "--retries relaunches mpirun jobs, not PS jobs",
                "PS jobs recover through TensorFlow's own fault tolerance; drop --retries",
            )

    def to_dict(self) -> dict:
        return _as_dict(self)


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
