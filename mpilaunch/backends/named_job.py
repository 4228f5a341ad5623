"""A job found again by its name: what `mpilaunch status|logs|wait|delete|stacks NAME` ask a
cluster backend, as one object per backend (``JobsByName.named_job``) made from the manage
arguments.

The backend says what the cluster holds, as typed values (``JobState``,
``JobStatus``) in one phase vocabulary (``PHASES``); printing them, `wait`'s
polling and its ``--timeout`` live once, in the job layer (``job/manage.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

PENDING, RUNNING, ATTACHED, SUCCEEDED, FAILED, KILLED, UNKNOWN = (
    "Pending",  # not running yet: scheduled, queued, its launcher starting
    "Running",
    "Attached",  # its mpirun runs in the mpilaunch that started it (--launcher local): no launcher here
    "Succeeded",
    "Failed",
    "Killed",  # ended from outside (`mpilaunch delete`, the cluster's own kill): nobody's exit code
    "Unknown",
)
PHASES = (PENDING, RUNNING, ATTACHED, SUCCEEDED, FAILED, KILLED, UNKNOWN)


@dataclass(frozen=True)
class JobState:
    """Where a job is, as `wait` polls it: its phase, and once it ended its exit code and why."""

    label: str  # how lines name the job: "job NAME", "job NAME (application_...)"
    phase: str  # one of PHASES
    exit_code: int | None = None  # None while it runs
    elapsed: float | None = None
    failure: str | None = None  # what ended it, when it failed
    summary: dict | None = None  # the closing summary's facts, as the job's launcher left them
    note: str = ""  # said after the phase: "(no launcher pod)"

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} is none of {PHASES}")


@dataclass(frozen=True)
class JobEntry:
    """One job (or one YARN application of the name) as `status` shows it."""

    title: str  # "job NAME  namespace NS", "application_...  NAME"
    state: JobState
    facts: str = ""  # the rest of the first line: "ranks=4 gpus=0  created ..."
    details: list[str] = field(default_factory=list)  # one line each: pods, containers, the outcome


@dataclass(frozen=True)
class JobStatus:
    entries: list[JobEntry]
    notes: list[str] = field(default_factory=list)  # lines after them: other applications of the name


class NamedJob(ABC):
    """Job ``args.name`` on one backend; each method raises UsageError (one line and a hint) for a
    job that is not there or not mpilaunch's, and touches nothing then."""

    #: how often `wait` asks ``state``
    poll_s = 1.0

    def __init__(self, args):
        self.args = args
        self.name = args.name

    @abstractmethod
    def status(self) -> JobStatus:
        """What the cluster holds of the job."""

    @abstractmethod
    def state(self) -> JobState:
        """Its phase now (and its end, once it ended), for `wait`."""

    @abstractmethod
    def logs(self, stream, follow: bool) -> None:
        """Its launcher's output to ``stream`` (``follow``: as it grows, until the job ends)."""

    @abstractmethod
    def delete(self, stream) -> None:
        """End it and delete what it made (only the user's own, only mpilaunch's); one line each."""

    @abstractmethod
    def stacks(self, deadline_s: float):
        """Every rank's stacks (a ``hang.collect.Collection``) of the running job, taken through
        the user's own channel into its workers or by its launcher; a UsageError with a hint where
        neither reaches them (ended, not started, or run with --launcher local)."""

    def exec_credentials(self, namespace: str | None) -> dict | None:
        """The user's own credentials for the workers' exec channel (server, TLS settings, token),
        ``namespace`` where the arguments name none: what `mpilaunch stacks` reaches the workers of a
        job found in a run directory on this machine with, never what its context names (issue 49).
        None where the user has no exec channel of their own (YARN: only the job's launcher has)."""
        return None
