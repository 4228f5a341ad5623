"""The required contract of a backend: its options, its capabilities, eleven methods.

A backend is one folder, ``backends/<name>/``, and one line in
``backends/__init__.py`` (or an entry point in the group
``mpilaunch.backends``) naming its options class. The options class
(``BackendOptions``) adds the backend's command-line options and names the
backend class (``backend_class``), which is imported only when a job runs
on it.

``BaseBackend`` is all a backend must implement: ``lifecycle.py`` drives
every backend through these methods, in this order: ``allocate`` ->
``wait_ready`` -> ``exec_context`` (written to the context file the shim
reads) -> the workload runs (asking ``rank_prefix``, ``rendezvous``; the
lifecycle asks ``lost_workers`` every few seconds) -> ``job_finished`` ->
``describe_workers`` (for reports) -> ``release`` (always, on every exit
path; idempotent, never raises). ``check_spec`` refuses a job before
anything is created; ``control_address`` tells the MPI daemons how to reach
this machine where its name does not resolve for them. Four methods are
abstract; the other seven have defaults that fit workers running this
machine's Python.

What a backend can do beyond that is data (``Capabilities``) and one of three
small optional protocols per capability, in ``protocols.py``, each shown by
one backend: a launcher inside the cluster (k8s), jobs found again by name
(yarn), lost workers replaced (local). Where the cluster keeps what mpilaunch
finds is a collaborator, ``cluster_notes`` (``cluster_notes.py``).
"""

from __future__ import annotations

import dataclasses
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..core import declared
from ..core.errors import UsageError
from ..core.spec import JobSpec, Plan

# typing.TYPE_CHECKING without importing typing: the annotation's name only
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .cluster_notes import ClusterNotes


@dataclass(frozen=True)
class Capabilities:
    """What a backend does beyond allocating workers, as data."""

    # Each capability comes with the protocol of ``protocols.py`` that serves it
    # (``protocols.SERVED_BY``); tests/lifecycle/test_backend_contract.py holds the two together.
    # --detach: the job is handed to a launcher in the cluster (``ClusterLauncher.hand_off``)
    detach: bool = False
    # --retries: lost workers are recreated in place (``ReplacesWorkers``)
    replace_workers: bool = False
    # --spares: workers beyond the plan take a rejected or lost worker's place at once (served by
    # ``ReplacesWorkers`` too: its ``replace_workers`` takes a waiting spare first)
    spares: bool = False
    # mpirun may run in a launcher in the cluster (``ClusterLauncher``)
    cluster_launcher: bool = False
    # `mpilaunch status|logs|delete|wait|stacks NAME` find the job again (``JobsByName``)
    manage: bool = False
    # `mpilaunch render` shows what a run would create (``JobsByName.render``)
    render: bool = False


@dataclass(frozen=True)
class BackendOptions:
    """A backend's own command-line options, kept in ``JobSpec.backend_options``.

    Subclasses are frozen dataclasses whose fields are their options, each declared once with
    ``core.declared.option`` (flag, type, default, help, where it goes when the job is detached);
    ``add_arguments`` (an argparse group titled with the backend's name) and ``from_args`` are
    made from the declarations, and ``__post_init__`` validates (``UsageError``: one line and a
    hint). The options reach the backend in the job's spec (``self.options``), never as parsed
    arguments.
    """

    # Class attributes, not fields (no annotation: importing typing for ClassVar costs every launch
    # ~2 ms). "package.module:Class" of the backend: imported only when a job runs on it.
    backend_class = ""
    # the pip extra that brings what the backend imports (install hint), None: nothing extra
    extra = None

    @classmethod
    def add_arguments(cls, group) -> None:
        """Add this backend's options for `mpilaunch run`/`render` to an argparse group."""
        if dataclasses.is_dataclass(cls):
            declared.add_arguments(cls, group)

    @classmethod
    def from_args(cls, args) -> "BackendOptions":
        """Each field from the parsed option of its name (a repeatable option's list as a tuple),
        its default where the parser has no such option."""
        return declared.from_args(cls, args) if dataclasses.is_dataclass(cls) else cls()

    @classmethod
    def add_manage_arguments(cls, parser) -> None:
        """Options that find a job again for status/logs/delete/wait (``--namespace``, ...)."""

    @classmethod
    def check_manage_arguments(cls, args) -> None:
        """Validate what ``add_manage_arguments`` added (UsageError)."""

    @classmethod
    def discover_gpus_per_node(cls, spec: JobSpec) -> int | None:
        """GPUs of one node where the job may run, when the cluster can tell (asked while planning,
        before any backend exists, when --gpus is given without --gpus-per-node); None: unknown."""
        return None

    @classmethod
    def discover_gpus(cls, spec: JobSpec):
        """``discover_gpus_per_node`` with what else the cluster told (``gpu_slots.GpuDiscovery``):
        its total, checked against --gpus, and why it could not tell, stated in a warning. A
        backend that lists its nodes overrides this one (k8s)."""
        from ..core.gpu_slots import GpuDiscovery

        return GpuDiscovery(per_node=cls.discover_gpus_per_node(spec))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class BaseBackend(ABC):
    """The required surface: ``allocate``, ``wait_ready``, ``exec_context``, ``release`` (abstract);
    ``lost_workers``, ``describe_workers``, ``job_finished``, ``check_spec``, ``rank_prefix``,
    ``rendezvous``, ``control_address`` (defaults). Everything else a backend may do is an optional protocol
    (``protocols.py``) it names among its bases, and a capability it claims."""

    name = "base"
    options_class: type[BackendOptions] = BackendOptions
    capabilities: Capabilities = Capabilities()
    # True where every worker shares this machine, so loopback reaches them (PS tasks bind there)
    workers_on_this_host: bool = False
    # True where the workers' daemons are sent this process's PATH, so a rank's program resolves
    # here as it will there (the environment check compares with it); set in __init__ where it
    # depends on the options (YARN: not with --env-archive)
    forwards_path: bool = False
    # True where the ranks start this machine's programs (local): the program is checked here
    # before anything is allocated (core/program_check.py). Elsewhere (ssh hosts, pods,
    # containers) only the workers can tell.
    checks_program_here: bool = False
    # True where mpirun runs in a launcher inside the cluster (a k8s Job, a
    # YARN container) rather than in this process; decided per job in __init__.
    launcher_in_cluster = False
    # The environment workers started on this machine get (the local backend's
    # agents): the launch's, without the settings inherited.py leaves out. Set
    # by the workload before ``allocate``; None: this process's environment.
    launch_environ: dict | None = None
    # The launch's token for the rank wrappers' lines (env_names.STATUS_TOKEN), set by the mpirun workload
    # before ``allocate``: a launcher in the cluster gets it in its launch description.
    status_token: str | None = None
    # Whether each worker must be a host of its own name, set by the mpirun workload before
    # ``allocate`` where the MPI tells workers apart only by host name (``needs_own_hostnames``:
    # Open MPI 5) and the job has several workers. Honoured where workers share this machine
    # (local: each agent in namespaces of its own, named after its worker); elsewhere each already is.
    own_hostnames: bool = False
    # Where the cluster keeps what mpilaunch finds about the job (a hang verdict, a worker's failed
    # preflight): a ``cluster_notes.ClusterNotes`` (k8s: Warning Events), set in __init__; None:
    # nowhere but the terminal and the record.
    cluster_notes: ClusterNotes | None = None

    def __init__(self, spec: JobSpec, plan: Plan, rundir: Path, *, cluster_launcher_allowed: bool = True):
        self.spec = spec
        self.plan = plan
        self.rundir = rundir
        # this backend's options (its options_class), the defaults where the spec has none
        self.options = spec.backend_options if spec.backend_options is not None else self.options_class()
        # where mpirun runs: "cluster" (a launcher pod/container) where the backend has one, the workload
        # allows it (PS mode does not: its registry is this mpilaunch) and --launcher is not local
        self.launcher = (
            "cluster"
            if self.capabilities.cluster_launcher and cluster_launcher_allowed and spec.launcher != "local"
            else "local"
        )
        # the mpirun workload's hook: mpirun runs in the cluster's launcher, run_launcher follows it
        self.launcher_in_cluster = self.launcher == "cluster"
        # phases this backend saw (phases.mark: name -> time.monotonic()), merged into report.json
        self.phase_times: dict[str, float] = {}
        # each worker's own phases (phases.mark_worker: worker -> phase -> time.monotonic()), report.json's
        # timings.workers: "created" (asked of the cluster / process started), "scheduled" (bound to a
        # node), "running" (its container runs), "ready" (its exec channel answers); what the backend sees
        self.worker_times: dict[str, dict[str, float]] = {}

    # ---------------------------------------------------------------- what every backend implements

    @abstractmethod
    def allocate(self) -> None:
        """Create the sleeping workers. Returns without waiting for them."""

    @abstractmethod
    def wait_ready(self, deadline: float, progress) -> None:
        """Block until every worker can take exec sessions (all or nothing).

        Raises AllocationError with the cluster's own reasons on timeout.
        ``deadline`` is a ``time.monotonic()`` value; ``progress(ready, total)``
        is called as workers come up, ``progress(ready, total, note)`` when
        something besides the scheduler holds them (a gang, a queue: why).
        """

    @abstractmethod
    def exec_context(self) -> dict:
        """The transport part of the shim's context file (transport name + workers, keyed by
        ``hostnames(plan)``: the host names mpirun is given)."""

    @abstractmethod
    def release(self) -> None:
        """Free every worker, container and process. Idempotent, never raises."""

    # ---------------------------------------------------------------- what every backend is asked (defaults)

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        """Workers that disappeared: name -> the backend's reason (``Evicted: ...``, ``its agent was killed by SIGKILL``).

        Asked every few seconds during the run (only authoritative signs:
        a worker must never be called lost because an answer was slow) and,
        with ``settle=True``, once more after a workload failed, when the
        backend may take a few seconds for the cluster to catch up.
        """
        return {}

    def describe_workers(self) -> dict[str, dict]:
        """Worker name -> facts for reports (host, state, exit status, ...)."""
        return {w.name: {} for w in self.plan.workers}

    def job_finished(self, exit_code: int, failure: str | None) -> str | None:
        """Called once with the job's outcome, before ``describe_workers`` and ``release``.

        Cluster backends use it to set the application's final status; the
        text returned (if any) is appended to the failure report.
        """
        return None

    @classmethod
    def check_spec(cls, spec: JobSpec) -> None:
        """Before anything is created: what the job asks of this backend, against its capabilities.
        A backend with rules of its own (ssh: --hostfile) adds them after ``super().check_spec``."""
        caps = cls.capabilities
        if spec.detach and not caps.detach:
            raise UsageError(
                f"--detach needs a cluster backend: {cls.name} workers live and die with this mpilaunch",
                "use --backend k8s or --backend yarn, or run without --detach",
            )
        if spec.launcher == "cluster" and not caps.cluster_launcher:
            raise UsageError(
                f"--launcher cluster needs a cluster backend; {cls.name} workers have no cluster to run mpirun in",
                "drop --launcher (mpirun runs on this machine) or use --backend k8s or yarn",
            )
        if spec.retries and not caps.replace_workers:
            raise UsageError(f"the {cls.name} backend cannot replace workers", "drop --retries")
        if spec.spares and not caps.spares:
            raise UsageError(
                f"--spares is not available with the {cls.name} backend yet",
                "drop --spares (--retries replaces a lost worker in place), or use --backend local or ssh",
            )

    def rank_prefix(self) -> list[str]:
        """How a worker starts mpilaunch's per-rank wrapper (its Python may differ from ours)."""
        return [sys.executable, "-m", "mpilaunch.rank"]

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        """torch.distributed's MASTER_ADDR and MASTER_PORT on ``worker`` (rank 0's), once the
        workers are ready: an address every rank can reach and a port free there. None: unknown."""
        return None

    def control_address(self) -> str | None:
        """The address at which the workers' MPI daemons reach an mpirun on this machine, where
        its host name may not resolve for them (hydra's proxies connect back by name); None:
        the name does (workers on this machine, a launcher in the cluster)."""
        return None


#: the required surface, by name: what a backend implementer reads (tests hold it to about ten)
REQUIRED = (
    "allocate",
    "wait_ready",
    "exec_context",
    "release",
    "lost_workers",
    "describe_workers",
    "job_finished",
    "check_spec",
    "rank_prefix",
    "rendezvous",
    "control_address",
)


def hostnames(plan: Plan) -> dict[str, str]:
    """Worker name -> the host name written into the hostfile, which the shim looks up in the
    context (``exec_context()["workers"]``): the worker's own name, for every backend."""
    return {w.name: w.name for w in plan.workers}
