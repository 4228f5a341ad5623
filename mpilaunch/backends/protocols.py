"""What a backend may do beyond the required surface (``base.py``): small opt-in protocols.

A backend opts into one by naming it among its bases, next to ``BaseBackend``,
and claiming the capability it serves (``SERVED_BY``); each is an ABC, so a
backend that names one and leaves a method out cannot be created.
The lifecycle, the workloads and ``manage`` ask ``isinstance(backend, ...)``
or the capabilities, never ``getattr``; where a backend has no such protocol
they use the plain-function defaults at the end of this file.

- ``ClusterLauncher``: mpirun runs in a launcher inside the cluster, which
  can also be left to run the job alone (--detach). Shown by k8s
  (``k8s/backend.py``: a launcher Job per attempt, followed through its log).
- ``JobsByName``: a job is found again by name (``mpilaunch render|status|
  logs|delete|wait|stacks``), through one object of the backend's
  ``named_job`` class (``named_job.py``). Shown by yarn (``yarn/backend.py``
  + ``yarn/manage.py``).
- ``ReplacesWorkers``: a lost worker gets a new one of the same name
  (--retries). Shown by local (``local/backend.py``: a new agent process).

Three, each serving capabilities a user asks for. What every backend has an
answer to, if only "none", is no protocol: ``BaseBackend.control_address``
(None unless the workers cannot resolve this machine's name: ssh, k8s's
local launcher), and the collaborator ``BaseBackend.cluster_notes``
(``cluster_notes.py``: where the cluster keeps what mpilaunch finds; k8s's
Events). A PS task starter starts through the rank wrapper's prefix
(``python -m mpilaunch.rank --task-starter``), so it needs no hook at all.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod


class ClusterLauncher(ABC):
    """mpirun runs in a launcher the backend starts inside the cluster (capabilities
    ``cluster_launcher`` and ``detach``). Example: ``backends/k8s/backend.py``."""

    @classmethod
    @abstractmethod
    def remote_mpi_info(cls, spec):
        """The MPI of the launcher in the cluster (``mpi.MpiInfo``), asked when there is no mpirun
        here; None: mpirun runs here."""

    @abstractmethod
    def run_launcher(self, output, deadline: float | None) -> int | None:
        """Run mpirun in the cluster's launcher, feed its output to ``output`` (``workloads.mpirun.RelayedOutput``)
        and return its exit code; None when ``deadline`` passed first. Only where ``launcher_in_cluster``."""

    @abstractmethod
    def relaunch(self, attempt: int) -> None:
        """Before attempt ``attempt`` of the workload (``--retries``): a new launcher (a Job on
        Kubernetes, a container on YARN) where ``launcher_in_cluster``; nothing otherwise."""

    @abstractmethod
    def hand_off(self, deadline: float, progress) -> None:
        """--detach: after ``allocate``, give the job to the launcher in the cluster (waiting as needed).

        Once this returns, mpilaunch exits and the launcher runs the job to its
        end and releases the workers; nothing here is released.
        """

    @abstractmethod
    def manage_flags(self) -> str:
        """The options that find this job again, printed after --detach: ``--backend k8s --namespace ns``."""

    def launcher_takes_lost_workers(self) -> bool:
        """Whether the launcher in the cluster replaces a lost worker itself (k8s: ``--retries`` with
        ``--spares``, a waiting spare pod swapped in without a new launcher pod): then this side
        does not stop it when a worker is lost, and its relaunches come as ``relaunched_in_launcher``."""
        return False

    def relaunched_in_launcher(self) -> list[dict]:
        """The attempts the launcher in the cluster ended and started again itself since last asked,
        in order: each ``{"at": monotonic, "ended": bool, "exit_code", "failure", "swaps": [{"worker",
        "spare", "why"}], "ranks": {"rank_times", "statuses"} or None}`` (``launcher_lines.swap_line``;
        ``ended``: an attempt ended (a lost worker), not a swap before the program (--preflight
        enforce); ``ranks``: the rank lines seen of the ended attempt, ``RankOutput.next_attempt``)."""
        return []


class JobsByName(ABC):
    """`mpilaunch render`, and everything a user does to a job by its name (`mpilaunch status|logs|
    wait|delete|stacks NAME`: capabilities ``render`` and ``manage``) through one object of the
    backend's ``named_job`` class (``named_job.NamedJob``), made from the parsed manage arguments.
    Example: ``backends/yarn/backend.py`` (``YarnNamedJob`` in ``backends/yarn/manage.py``)."""

    #: the backend's ``named_job.NamedJob`` subclass
    named_job: type | None = None

    @abstractmethod
    def render(self) -> str:
        """What a run would create, as the cluster's own manifests."""


class ReplacesWorkers(ABC):
    """--retries: lost workers come back under their names (capability ``replace_workers``).
    Example: ``backends/local/backend.py``."""

    @abstractmethod
    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        """Replace lost (or, ``why`` "preflight", rejected) workers; ``wait_ready`` follows.

        The rest of the allocation stays as it is. Where the backend keeps spares (capability
        ``spares``, ``spare_pool.py``) a waiting spare serves the worker at once and another is
        asked for; else a new worker of the same name. Returns worker -> the spare now serving it.
        """

    def spares_waiting(self) -> int:
        """How many spares wait for a worker's place now (capability ``spares``)."""
        return 0

    def spares_coming(self) -> int:
        """How many spares are still starting (asked for, not lost, not ready yet): worth waiting
        for before a swap gives up (capability ``spares``)."""
        return 0

    def can_replace(self, names: list[str]) -> bool:
        """Whether ``replace_workers(names)`` can serve them all now; a backend that only swaps in
        spares (the k8s launcher pod: it may create no pod) says no when too few wait."""
        return True

    def swapped(self, taken: dict[str, str], why: str, ended) -> None:
        """Told after each swap (worker -> spare), with the ended attempt's ``JobResult`` where ``why``
        is "lost" (None before the program): where the swap must be known beyond this process (the
        k8s launcher pod tells the submitting side, which deletes the replaced pods and asks for
        new spares)."""

    def worker_changes(self):
        """A context manager giving a ``threading.Event`` set whenever a worker may have changed (k8s:
        a watch on the job's pods), so that ``lost_workers`` is asked, and the worker replaced, at
        once rather than at the next look; None: no such signal, the looks keep their interval."""
        return contextlib.nullcontext()


#: capability (a ``Capabilities`` field) -> the protocol a backend claiming it implements
SERVED_BY = {
    "detach": ClusterLauncher,
    "cluster_launcher": ClusterLauncher,
    "manage": JobsByName,
    "render": JobsByName,
    "replace_workers": ReplacesWorkers,
}

#: every optional protocol
PROTOCOLS = (
    ClusterLauncher,
    JobsByName,
    ReplacesWorkers,
)


def members(protocol: type) -> tuple[str, ...]:
    """The methods a backend naming ``protocol`` implements."""
    return tuple(sorted(protocol.__abstractmethods__))


# ------------------------------------------------------------------ defaults where a backend has no protocol


def remote_mpi_info(backend_cls, spec):
    """``ClusterLauncher.remote_mpi_info``; None (mpirun runs here) for every other backend."""
    return backend_cls.remote_mpi_info(spec) if issubclass(backend_cls, ClusterLauncher) else None


def named_job(backend_cls, args):
    """Job ``args.name`` on a ``JobsByName`` backend (its ``named_job``); None on any other."""
    return backend_cls.named_job(args) if issubclass(backend_cls, JobsByName) else None


def stacks_by_name(backend_cls, args):
    """Every rank's stacks (a ``hang.collect.Collection``) of a job no mpilaunch on this machine
    runs, found by its name (``NamedJob.stacks``); None where the backend finds no job by name:
    local and ssh (the job's mpilaunch alone reaches its workers: run `mpilaunch stacks` where it
    runs)."""
    job = named_job(backend_cls, args)
    return None if job is None else job.stacks(args.deadline)


def exec_credentials(backend_cls, args, namespace: str | None = None) -> dict | None:
    """``NamedJob.exec_credentials``; None where the user has no exec channel of their own."""
    job = named_job(backend_cls, args)
    return None if job is None else job.exec_credentials(namespace)
