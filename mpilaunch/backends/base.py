"""The small interface every backend implements.

``lifecycle.py`` drives every backend through these hooks, in this order:
``allocate`` -> ``wait_ready`` -> ``exec_context`` (written to the context
file the shim reads) -> mpirun runs -> ``describe_workers`` (for reports)
-> ``release`` (always, on every exit path; must be idempotent and must not
raise).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import UsageError
from ..spec import JobSpec, Plan


class BaseBackend(ABC):
    name = "base"
    # True where mpirun runs in a launcher inside the cluster (a k8s Job, a
    # YARN container) rather than in this process; set per job by the backends
    # that have one.
    launcher_in_cluster = False
    # The environment workers started on this machine get (the local backend's
    # agents): the launch's, without the settings inherited.py leaves out. Set
    # by the workload before ``allocate``; None: this process's environment.
    launch_environ: dict | None = None
    # The launch's token for the rank wrappers' lines (rank.TOKEN_ENV), set by the mpirun workload
    # before ``allocate``: a launcher in the cluster gets it in its launch description.
    status_token: str | None = None

    def __init__(self, spec: JobSpec, plan: Plan, rundir: Path):
        self.spec = spec
        self.plan = plan
        self.rundir = rundir
        # phases this backend saw (phases.mark: name -> time.monotonic()), merged into report.json
        self.phase_times: dict[str, float] = {}

    @classmethod
    def discover_gpus_per_node(cls, spec: JobSpec) -> int | None:
        """GPUs of one node, when the backend can tell (used when --gpus-per-node is absent)."""
        return None

    @abstractmethod
    def allocate(self) -> None:
        """Create the sleeping workers. Returns without waiting for them."""

    @abstractmethod
    def wait_ready(self, deadline: float, progress) -> None:
        """Block until every worker can take exec sessions (all or nothing).

        Raises AllocationError with the cluster's own reasons on timeout.
        ``deadline`` is a ``time.monotonic()`` value; ``progress(ready, total)``
        is called as workers come up.
        """

    @abstractmethod
    def exec_context(self) -> dict:
        """The transport part of the shim's context file (transport name + workers)."""

    def hostnames(self) -> dict[str, str]:
        """Worker name -> the host name written into the hostfile."""
        return {w.name: w.name for w in self.plan.workers}

    def control_address(self) -> str | None:
        """The address at which the workers' MPI daemons reach an mpirun on this machine, where
        its host name may not resolve for them (hydra's proxies connect back by name); None:
        the name does."""
        return None

    def forwards_path(self) -> bool:
        """Whether the workers' daemons are sent this process's PATH (so a rank's program
        resolves here as it will there: the environment check compares with it)."""
        return False

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        """torch.distributed's MASTER_ADDR and MASTER_PORT on ``worker`` (rank 0's), once the
        workers are ready: an address every rank can reach and a port free there. None: unknown."""
        return None

    def rank_prefix(self) -> list[str]:
        """How a worker starts mpilaunch's per-rank wrapper (its Python may differ from ours)."""
        return [sys.executable, "-m", "mpilaunch.rank"]

    def task_starter_prefix(self) -> list[str]:
        """How a worker starts mpilaunch's PS task starter: as the rank wrapper, another module."""
        prefix = list(self.rank_prefix())
        if len(prefix) >= 2 and prefix[-2:] == ["-m", "mpilaunch.rank"]:
            return prefix[:-1] + ["mpilaunch.task_starter"]
        return ["python3", "-m", "mpilaunch.task_starter"]

    def job_finished(self, exit_code: int, failure: str | None) -> str | None:
        """Called once with the job's outcome, before ``describe_workers`` and ``release``.

        Cluster backends use it to set the application's final status; the
        text returned (if any) is appended to the failure report.
        """
        return None

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        """Workers that disappeared: name -> the backend's reason (``Evicted: ...``, ``its agent was killed by SIGKILL``).

        Asked every few seconds during the run (only authoritative signs:
        a worker must never be called lost because an answer was slow) and,
        with ``settle=True``, once more after a workload failed, when the
        backend may take a few seconds for the cluster to catch up.
        """
        return {}

    def hand_off(self, deadline: float, progress) -> None:
        """--detach: after ``allocate``, give the job to the launcher in the cluster (waiting as needed).

        Once this returns, mpilaunch exits and the launcher runs the job to its
        end and releases the workers; nothing here is released.
        """
        raise UsageError(f"--detach is not available with the {self.name} backend", "run without --detach")

    def manage_flags(self) -> str:
        """The options that find this job again: ``--backend k8s --namespace ns``."""
        return f"--backend {self.name}"

    def relaunch(self, attempt: int) -> None:
        """Before attempt ``attempt`` of the workload (``--retries``): renew what the backend runs it with.

        With a launcher in the cluster: a new launcher Job (Kubernetes) or container (YARN). Others: nothing.
        """

    def replace_workers(self, names: list[str]) -> None:
        """Replace lost workers by new ones of the same name (``--retries``); ``wait_ready`` follows.

        The rest of the allocation stays as it is.
        """
        raise UsageError(f"the {self.name} backend cannot replace workers", "drop --retries")

    def describe_workers(self) -> dict[str, dict]:
        """Worker name -> facts for reports (host, state, exit status, ...)."""
        return {w.name: {} for w in self.plan.workers}

    @abstractmethod
    def release(self) -> None:
        """Free every worker, container and process. Idempotent, never raises."""
