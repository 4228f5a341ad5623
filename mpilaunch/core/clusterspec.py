"""PS mode, pure part: which tasks a job has, and what each task is told.

* ``requirements_from_options``: ``--ps/--workers/--chief/--evaluator`` or the
  YARN-DTF form ``-r "ps:2,worker:4"`` -> ``(("ps", 2), ("worker", 4))``.
* ``task_list``: the tasks (``ps:0``, ``worker:1`` ...) plus the TensorBoard
  task, which is not part of the TensorFlow cluster.
* ``cluster_spec`` / ``tf_config`` / ``task_environment``: what each task
  gets once every task starter reported its ``host:port``: ``TF_CONFIG``
  (TensorFlow), ``DTF_*`` (YARN-DTF), ``TF_CLUSTER_DEF``/``TF_ROLE``/
  ``TF_INDEX`` (TensorFlow on YARN at 360).

No I/O here; ``workloads/ps.py`` runs the job and ``task_starter.py`` runs inside
each container.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from . import env_names
from .errors import UsageError

TENSORBOARD = "tensorboard"
# TensorFlow's own task types; any other name from -r is a plain job name.
CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"
# Jobs TensorFlow allows at most one task of.
SINGLETONS = (CHIEF, EVALUATOR)
# Order of the jobs in listings: coordinator first, then the ones it drives.
_ORDER = {CHIEF: 0, WORKER: 1, PS: 2, EVALUATOR: 3}

# Job names become DTF_{NAME}_HOSTS and part of container names.
_JOB_RE = re.compile(r"[a-z][a-z0-9_]{0,14}")  # <job>-<name>-<i> fits 63 characters
REQUIREMENT_HINT = 'write JOB:COUNT pairs separated by commas, e.g. -r "ps:2,worker:4"'


@dataclass(frozen=True, order=True)
class Task:
    type: str
    index: int

    @property
    def id(self) -> str:
        """``worker:1``, as in TensorFlow's and tf-yarn's reports."""
        return f"{self.type}:{self.index}"

    @property
    def in_cluster(self) -> bool:
        return self.type != TENSORBOARD

    def worker_name(self, job_name: str) -> str:
        """The container that runs this task, e.g. ``mpl-1a2b3c-worker-1``."""
        return f"{job_name}-{self.type.replace('_', '-')}-{self.index}"

    def log_name(self) -> str:
        return f"{self.type}-{self.index}.log"


# ------------------------------------------------------------------ requirements


def parse_requirement(text: str) -> tuple[tuple[str, int], ...]:
    """``"ps:2,worker:4"`` -> ``(("ps", 2), ("worker", 4))``, validated."""
    if not text or not text.strip():
        raise UsageError("empty cluster requirement", REQUIREMENT_HINT)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for part in text.split(","):
        item = part.strip()
        name, sep, count_text = item.partition(":")
        name, count_text = name.strip(), count_text.strip()
        if not sep or not name:
            raise UsageError(f"bad cluster requirement {item!r} in {text!r}", REQUIREMENT_HINT)
        if not _JOB_RE.fullmatch(name):
            raise UsageError(
                f"bad job name {name!r} in cluster requirement {text!r}",
                "job names are up to 15 lowercase letters, digits and '_', starting with a letter (e.g. ps, worker, chief)",
            )
        if name == TENSORBOARD:
            raise UsageError(
                "'tensorboard' is not a job of the TensorFlow cluster",
                "use --tensorboard (with -o OUTPUT) to run TensorBoard next to the job",
            )
        if not (count_text.isascii() and count_text.isdigit()):  # int() refuses "²", which isdigit() accepts
            raise UsageError(f"task count of {name!r} must be a whole number, got {count_text!r}", REQUIREMENT_HINT)
        count = int(count_text)
        if count < 1:
            raise UsageError(
                f"job {name!r} needs at least 1 task, got {count}",
                f"leave {name!r} out of the requirement, or give it a positive count",
            )
        if name in seen:
            raise UsageError(
                f"job {name!r} appears twice in cluster requirement {text!r}",
                "name each job once, with its total task count",
            )
        seen.add(name)
        out.append((name, count))
    return tuple(out)


def requirements_from_options(ps_options) -> tuple[tuple[str, int], ...]:
    """The jobs of a PS-mode run from its ``PsOptions``; raises UsageError."""
    o = ps_options
    if o.ps < 0 or o.workers < 0:
        flag = "--ps" if o.ps < 0 else "--workers"
        raise UsageError(f"{flag} must not be negative", "give a task count, e.g. --ps 2 --workers 4")
    requirement = getattr(o, "requirement", None)
    if requirement is not None:
        if o.ps or o.workers:
            raise UsageError(
                "-r/--cluster-requirement and --ps/--workers both size the job",
                'use one form: -r "ps:2,worker:4" or --ps 2 --workers 4',
            )
        jobs = list(parse_requirement(requirement))
    else:
        jobs = [(WORKER, o.workers)] if o.workers else []
        if o.ps:
            jobs.append((PS, o.ps))
    names = {name for name, _ in jobs}
    for flag, job, wanted in (("--chief", CHIEF, o.chief), ("--evaluator", EVALUATOR, o.evaluator)):
        if wanted:
            if job in names:
                raise UsageError(
                    f"{flag} and -r {job}:N both ask for the {job}",
                    f"drop {flag}, or {job} from -r",
                )
            jobs.append((job, 1))
            names.add(job)
    if not jobs:
        raise UsageError(
            "PS mode needs tasks to run",
            'give --ps N --workers N [--chief] [--evaluator], or -r "ps:2,worker:4"',
        )
    for job, count in jobs:
        if job in SINGLETONS and count > 1:
            raise UsageError(f"TensorFlow allows one {job} task, got {job}:{count}", f"use {job}:1")
    if CHIEF not in names and WORKER not in names:
        raise UsageError(
            "the job has no chief and no worker, so nothing decides when it is done",
            "add --workers N or --chief (the job succeeds when the chief, or else every worker, exits 0)",
        )
    if o.tensorboard and not o.output_path:
        raise UsageError(
            "--tensorboard needs an output directory to read",
            "give -o/--output DIR (the directory your job writes its summaries to)",
        )
    return tuple(sorted(jobs, key=lambda j: (_ORDER.get(j[0], 9), j[0])))


def task_list(jobs, tensorboard: bool = False) -> tuple[Task, ...]:
    tasks = [Task(job, i) for job, count in jobs for i in range(count)]
    if tensorboard:
        tasks.append(Task(TENSORBOARD, 0))
    return tuple(tasks)


# ------------------------------------------------------------------ life cycle roles


def decisive_tasks(tasks) -> tuple[Task, ...]:
    """The tasks whose success ends the job: the chief, else every worker (YARN-DTF)."""
    chief = tuple(t for t in tasks if t.type == CHIEF)
    return chief or tuple(t for t in tasks if t.type == WORKER)


def fails_job(task: Task) -> bool:
    """A non-zero exit of this task fails the job (TensorBoard never does)."""
    return task.in_cluster


# ------------------------------------------------------------------ what a task is told


def placeholder_addresses(tasks, job_name: str) -> dict[Task, str]:
    """Addresses for ``render``/``--dry-run``: the real ports are reserved at run time."""
    return {t: f"{t.worker_name(job_name)}:PORT" for t in tasks}


def cluster_spec(tasks, addresses) -> dict[str, list[str]]:
    """Job name -> addresses in task order (TensorFlow's ClusterSpec as a dict)."""
    cluster: dict[str, list[str]] = {}
    for task in sorted((t for t in tasks if t.in_cluster), key=lambda t: (_ORDER.get(t.type, 9), t.type, t.index)):
        cluster.setdefault(task.type, []).append(addresses[task])
    return cluster


def tf_config(cluster: dict, task: Task) -> dict:
    return {"cluster": cluster, "task": {"type": task.type, "index": task.index}}


def hosts_variable(job: str) -> str:
    return f"DTF_{job.upper()}_HOSTS"


def task_environment(cluster: dict, task: Task, ps_options=None, script_path: str | None = None) -> dict[str, str]:
    """Every variable a task starts with, as strings."""
    env: dict[str, str] = {}
    for job, hosts in cluster.items():
        env[hosts_variable(job)] = ",".join(hosts)
    env["DTF_TASK_JOB_NAME"] = task.type
    env["DTF_TASK_INDEX"] = str(task.index)
    if ps_options is not None:
        if ps_options.input_path:
            env["DTF_INPUT_PATH"] = ps_options.input_path
        if ps_options.output_path:
            env["DTF_OUTPUT_PATH"] = ps_options.output_path
    if script_path:
        env["DTF_TASK_SCRIPT"] = script_path
    if task.in_cluster:
        env["TF_CONFIG"] = json.dumps(tf_config(cluster, task), separators=(",", ":"))
        env["TF_CLUSTER_DEF"] = json.dumps(cluster, separators=(",", ":"))
        env["TF_ROLE"] = task.type
        env["TF_INDEX"] = str(task.index)
    return env


def tensorboard_command(python: list[str]) -> str:
    """Shell command of the TensorBoard task (its port is the one its starter reserved)."""
    import shlex

    return (
        " ".join(shlex.quote(p) for p in python)
        + f' -m tensorboard.main --logdir "$DTF_OUTPUT_PATH" --bind_all --port "${env_names.TASK_PORT}"'
    )
