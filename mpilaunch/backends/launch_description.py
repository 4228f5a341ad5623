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
from ..core.spec import CARRIED, JobSpec, Plan, WorkerPlan, detached_kind


@dataclass(frozen=True)
class LaunchWorker:
    name: str
    slots: int
    address: str | None = None  # where its agent listens (agent transports); None: reached by name


def _from_json(value):
    """JSON has lists where the spec has tuples."""
    return tuple(value) if isinstance(value, list) else value


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def slot_runs(job: str, workers) -> list[list[int]] | None:
    """``[[slots, count], ...]`` when the workers are ``<job>-worker-0..N-1`` in order with no
    address (a cluster job's pods): 8192 workers in a few bytes, so a job's description stays
    far below a ConfigMap's 1 MiB (a list of names took 655 KB there). None otherwise."""
    if any(w.name != worker_name(job, i) or getattr(w, "address", None) is not None for i, w in enumerate(workers)):
        return None
    return [[slots, len(list(same))] for slots, same in groupby(w.slots for w in workers)]


def carried_spec(spec: JobSpec) -> dict:
    """The JobSpec fields a launcher in the cluster runs the job with (``spec.CARRIED``), unchanged.
    Attached, the submitting side enforces --timeout and --stall-timeout itself: the launcher must
    not race it to the verdict."""
    out = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if detached_kind(f) == CARRIED}
    if not spec.detach:
        out.update(timeout=None, stall_timeout=None)
    return out


_CARRIED = tuple(f.name for f in dataclasses.fields(JobSpec) if detached_kind(f) == CARRIED)


@dataclass(frozen=True)
class LaunchDescription:
    job: str
    workers: tuple[LaunchWorker, ...]
    spec: dict  # the job's options, as carried_spec gives them (command, mpi, timeouts, ...)
    rank_prefix: tuple[str, ...] = ("python3", "-m", "mpilaunch.rank")  # how a worker starts the rank wrapper
    mpirun: str | None = None  # the launcher's mpirun (the image's, the container's); None: found on PATH
    env: tuple[str, ...] = ()  # -x NAME=VALUE for every rank, values taken on the submitting side
    attempt: int = 1  # --retries: the ranks see it as MPILAUNCH_ATTEMPT
    # --retries the launcher may make itself, counted from the job's first attempt (k8s: a lost
    # worker's place swapped to a spare pod it sees Ready); the submitting side makes the others
    relaunches: int = 0
    # the rank wrappers' lines count only with the submitting side's token (rank.py)
    status_token: str | None = None
    cwd: str | None = None  # mpirun's working directory where it exists there; None: the launcher's own
    cluster: dict = field(default_factory=dict)  # the backend's own part (module docstring)

    # the parts kept from readers of the job's objects (Kubernetes: in a Secret, not the ConfigMap)
    SECRET_FIELDS = ("env", "status_token")

    def __post_init__(self):
        # what from_dict's generic read cannot tell from the JSON types alone
        if (
            not isinstance(self.job, str)
            or not isinstance(self.attempt, int)
            or not isinstance(self.relaunches, int)
            or not isinstance(self.cluster, dict)
        ):
            raise TypeError(
                f"job {self.job!r}, attempt {self.attempt!r}, relaunches {self.relaunches!r}, "
                f"cluster: {type(self.cluster).__name__}"
            )

    @property
    def command(self) -> tuple[str, ...]:
        return tuple(self.spec["command"])

    @property
    def mpi(self) -> str:
        return self.spec.get("mpi") or "auto"

    @property
    def detach(self) -> bool:
        return bool(self.spec.get("detach"))

    def to_dict(self) -> dict:
        """Flat JSON: the carried options beside the description's own fields."""
        out = {name: getattr(self, name) for name in self._own_fields()} | dict(self.spec)
        out["rank_prefix"] = list(self.rank_prefix)
        out["env"] = list(self.env)
        runs = slot_runs(self.job, self.workers)
        if runs is not None:
            del out["workers"]
            out["worker_slots"] = runs  # [[slots, count], ...] of <job>-worker-0..N-1
        else:
            out["workers"] = [dataclasses.asdict(w) for w in self.workers]
        return out

    @classmethod
    def _own_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "spec")

    @classmethod
    def from_dict(cls, data: dict) -> "LaunchDescription":
        """The launcher's side: every field of its own and every carried option from the flat JSON
        of ``to_dict``, by name; a malformed description is a UsageError naming what is wrong."""
        try:
            if "worker_slots" in data:
                slots = [int(n) for n, count in data["worker_slots"] for _ in range(int(count))]
                workers = tuple(LaunchWorker(worker_name(str(data["job"]), i), n) for i, n in enumerate(slots))
            else:
                workers = tuple(LaunchWorker(**w) for w in data["workers"])
            spec = {name: _from_json(data[name]) for name in _CARRIED if name in data}
            if "command" not in spec:
                raise KeyError("command")
            own = {name: _from_json(data[name]) for name in cls._own_fields() if name != "workers" and name in data}
            return cls(workers=workers, spec=spec, **own)
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
        # detach=False: the launcher runs the job to its end (a detached spec would submit it again);
        # its mpirun is found from ``mpirun`` (find_mpirun), as before
        return JobSpec(**(self.spec | {"detach": False}), name=self.job, env=self.env, retries=self.relaunches)

    def plan(self) -> Plan:
        return Plan(
            job_name=self.job, workers=tuple(WorkerPlan(name=w.name, slots=w.slots, gpus=0) for w in self.workers)
        )

    def addresses(self) -> dict[str, str | None]:
        return {w.name: w.address for w in self.workers}
