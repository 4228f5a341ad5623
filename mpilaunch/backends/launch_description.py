"""What an in-cluster launcher is told: one value object for every backend that has one.

The submitting side builds a ``LaunchDescription`` (``backends/<name>/launch.py``),
sends it as JSON (a ConfigMap on Kubernetes, skein's key-value store on
YARN) and the launcher reads it back with ``from_dict`` and runs the job
from ``job_spec()`` and ``plan()``, as the submitting side would have.
What only one backend needs rides in ``cluster`` (Kubernetes: namespace,
container, where its Secret is mounted; YARN: the environment to forward).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import groupby

from ..core.errors import UsageError
from ..core.spec import JobSpec, Plan, WorkerPlan


@dataclass(frozen=True)
class LaunchWorker:
    name: str
    slots: int
    address: str | None = None  # where its agent listens (agent transports); None: reached by name


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def slot_runs(job: str, workers) -> list[list[int]] | None:
    """``[[slots, count], ...]`` when the workers are ``<job>-worker-0..N-1`` in order with no
    address (a cluster job's pods): 8192 workers in a few bytes, so a job's description stays
    far below a ConfigMap's 1 MiB (a list of names took 655 KB there). None otherwise."""
    if any(w.name != worker_name(job, i) or getattr(w, "address", None) is not None for i, w in enumerate(workers)):
        return None
    return [[slots, len(list(same))] for slots, same in groupby(w.slots for w in workers)]


@dataclass(frozen=True)
class LaunchDescription:
    job: str
    workers: tuple[LaunchWorker, ...]
    command: tuple[str, ...]
    rank_prefix: tuple[str, ...]  # how a worker starts the rank wrapper (its Python may differ)
    mpi: str = "auto"
    mpirun: str | None = None  # the launcher's mpirun (the image's, the container's); None: found on PATH
    env: tuple[str, ...] = ()  # -x NAME=VALUE for every rank, values taken on the submitting side
    mpi_args: tuple[str, ...] = ()
    bind_gpus: bool = False
    verify: bool = True
    start_timeout: float = 300.0
    # detached, the launcher enforces --timeout itself; attached, the submitting side does (None here)
    timeout: float | None = None
    detach: bool = False
    attempt: int = 1  # --retries: the ranks see it as MPILAUNCH_ATTEMPT
    # the rank wrappers' lines count only with the submitting side's token (rank.py)
    status_token: str | None = None
    cwd: str | None = None  # mpirun's working directory where it exists there; None: the launcher's own
    cluster: dict = field(default_factory=dict)  # the backend's own part (module docstring)

    # the parts kept from readers of the job's objects (Kubernetes: in a Secret, not the ConfigMap)
    SECRET_FIELDS = ("env", "status_token")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        runs = slot_runs(self.job, self.workers)
        if runs is not None:
            del out["workers"]
            out["worker_slots"] = runs  # [[slots, count], ...] of <job>-worker-0..N-1
        else:
            out["workers"] = [dataclasses.asdict(w) for w in self.workers]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "LaunchDescription":
        """The launcher's side; a malformed description is a UsageError naming what is wrong."""
        try:
            if "worker_slots" in data:
                slots = [int(n) for n, count in data["worker_slots"] for _ in range(int(count))]
                workers = tuple(LaunchWorker(worker_name(str(data["job"]), i), n) for i, n in enumerate(slots))
            else:
                workers = tuple(
                    LaunchWorker(name=str(w["name"]), slots=int(w["slots"]), address=w.get("address"))
                    for w in data["workers"]
                )
            return cls(
                job=str(data["job"]),
                workers=workers,
                command=tuple(data["command"]),
                rank_prefix=tuple(data.get("rank_prefix") or ("python3", "-m", "mpilaunch.rank")),
                mpi=data.get("mpi") or "auto",
                mpirun=data.get("mpirun"),
                env=tuple(data.get("env") or ()),
                mpi_args=tuple(data.get("mpi_args") or ()),
                bind_gpus=bool(data.get("bind_gpus")),
                verify=bool(data.get("verify", True)),
                start_timeout=float(data.get("start_timeout") or 300.0),
                timeout=data.get("timeout"),
                detach=bool(data.get("detach")),
                attempt=int(data.get("attempt") or 1),
                status_token=data.get("status_token"),
                cwd=data.get("cwd"),
                cluster=dict(data.get("cluster") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(
                f"malformed launch description: {type(e).__name__}: {e}",
                "the launcher reads what this version of mpilaunch wrote; submit with the same "
                "version as the image's or the job's tools",
            ) from None

    def without_secrets(self) -> "LaunchDescription":
        return dataclasses.replace(self, env=(), status_token=None)

    def secrets(self) -> dict:
        return {name: getattr(self, name) for name in self.SECRET_FIELDS}

    def with_secrets(self, secrets: dict) -> "LaunchDescription":
        return dataclasses.replace(self, env=tuple(secrets.get("env") or ()), status_token=secrets.get("status_token"))

    def job_spec(self) -> JobSpec:
        """The spec the launcher's lifecycle runs: what the submitting side's would have been."""
        return JobSpec(
            command=self.command,
            bind_gpus=self.bind_gpus,
            name=self.job,
            env=self.env,
            mpi_args=self.mpi_args,
            start_timeout=self.start_timeout,
            verify=self.verify,
            timeout=self.timeout,
        )

    def plan(self) -> Plan:
        return Plan(
            job_name=self.job, workers=tuple(WorkerPlan(name=w.name, slots=w.slots, gpus=0) for w in self.workers)
        )

    def addresses(self) -> dict[str, str | None]:
        return {w.name: w.address for w in self.workers}
