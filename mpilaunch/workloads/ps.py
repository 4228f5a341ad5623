"""The PS workload: one container per task, the launcher as registry, YARN-DTF's life cycle.

The launcher is the registry of YARN-DTF's "alternative implementation"
(no ZooKeeper), on every backend alike:

1. One worker of the backend per task (``<job>-ps-0``, ``<job>-worker-1``,
   ``<job>-chief-0`` ...), one slot each, allocated all or nothing through
   the same lifecycle (``lifecycle.py``) as allreduce jobs.
2. In each, through the backend's exec channel (``mpilaunch-rsh``, so every
   transport works), a task starter (``task_starter.py``) reserves a port
   and reports ``host:port`` on its stdout.
3. Once all reported, each starter gets its environment (TF_CONFIG, DTF_*,
   TF_CLUSTER_DEF ...) as one JSON line on its stdin and starts the task.
4. Life cycle (YARN-DTF): the job succeeds when the chief (without a chief:
   every worker) exited 0, and fails with the exit code of the first task
   of the cluster that exits non-zero; then everything left is stopped.
   TensorBoard never changes the outcome.  Stopping a task = closing its
   starter's stdin (the starter ends the task), then signals, then the
   backend's release.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import clusterspec, env_names, mpi
from ..core.clusterspec import Task
from ..core.errors import AllocationError, UsageError
from ..core.exit_codes import EXIT_TIMEOUT
from ..core.result import JobResult, timeout_failure
from ..core.spec import MAX_WORKERS, JobSpec, Plan, WorkerPlan
from ..rank import TASK_STARTER
from ..runtime.output import echo_line
from ..runtime.procs import kill_tree
from ..runtime.progress import WaitProgress
from ..task_starter import ADDRESS_PREFIX
from .base import RunContext, Workload, print_manifests, shim_path

TAIL_LINES = 20
# A task that exits while being stopped was stopped; give starters this long
# to end their tasks (their own grace is task_starter.STOP_GRACE) ...
STOP_WAIT = 8.0
# ... then signal the exec channel (the shim relays, then hangs up) and wait this long.
SIGNAL_WAIT = 5.0
POLL = 0.1


# ------------------------------------------------------------------ planning


@dataclass(frozen=True)
class PsPlan:
    job_name: str
    tasks: tuple[Task, ...]
    plan: Plan  # the backend's view: one 1-slot worker per task

    def worker(self, task: Task) -> str:
        return task.worker_name(self.job_name)


def make_ps_plan(spec: JobSpec, job_name: str) -> PsPlan:
    for flag, value in (
        ("--np", spec.np),
        ("--gpus", spec.gpus),
        ("--hostfile", spec.hostfile),
        ("--slots-per-worker", spec.slots_per_worker),
    ):
        if value is not None:
            raise UsageError(
                f"{flag} sizes allreduce jobs, not PS mode",
                'size PS jobs with --ps N --workers N [--chief] [--evaluator] or -r "ps:2,worker:4"',
            )
    jobs = clusterspec.requirements_from_options(spec.ps)
    total = sum(count for _, count in jobs)  # one worker per task: check before the tasks are listed
    if total > MAX_WORKERS:
        raise UsageError(
            f"the PS job asks for {total} tasks, one worker each; mpilaunch launches at most {MAX_WORKERS} workers",
            f"give at most {MAX_WORKERS} tasks in all (docs/usage.md, 'Sizing')",
        )
    tasks = clusterspec.task_list(jobs, spec.ps.tensorboard)
    gpus = spec.gpus_per_node or 0  # GPUs for each compute task (chief, worker)
    workers = tuple(
        WorkerPlan(
            name=t.worker_name(job_name), slots=1, gpus=gpus if t.type in (clusterspec.CHIEF, clusterspec.WORKER) else 0
        )
        for t in tasks
    )
    return PsPlan(job_name, tasks, Plan(job_name=job_name, workers=workers))


def read_script(path: str | None) -> dict | None:
    """``-s FILE``: shipped to every task through its starter (no shared file system needed)."""
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read --script {path}: {e.strerror}", "give an existing, readable file") from None
    return {"name": os.path.basename(path), "data": base64.b64encode(data).decode("ascii")}


def user_environment(spec: JobSpec, environ: dict) -> dict[str, str]:
    """``-x NAME[=VALUE]`` for every task, as for allreduce ranks."""
    return mpi.resolve_env([item.split("=", 1)[0] for item in spec.env], spec.env, environ)


def task_message(spec: JobSpec, cluster: dict, task: Task, environ: dict, script) -> dict:
    """What a task starter receives on stdin once the ClusterSpec is complete."""
    env = {**user_environment(spec, environ), **clusterspec.task_environment(cluster, task, spec.ps)}
    return {"env": env, "script": script}


def python_prefix(backend) -> list[str]:
    """How a worker starts its Python, taken from the backend's rank wrapper prefix."""
    prefix = list(backend.rank_prefix())
    if len(prefix) >= 2 and prefix[-2:] == ["-m", "mpilaunch.rank"]:
        return prefix[:-2]
    return ["python3"]


def task_host_option(backend) -> list[str]:
    # Workers that share this machine (local "containers"): loopback always works there.
    # Elsewhere each starter finds its own reachable address.
    return ["--host", "127.0.0.1"] if backend.workers_on_this_host else []


def starter_command(spec: JobSpec, task: Task, backend) -> str:
    """The shell command run in the task's container."""
    if task.in_cluster:
        command = list(spec.command)
    else:
        command = [clusterspec.tensorboard_command(python_prefix(backend))]
    argv = [*backend.rank_prefix(), TASK_STARTER, "--task", task.id, *task_host_option(backend), "--", *command]
    return shlex.join(argv)


# ------------------------------------------------------------------ exec channel


def exec_in_worker(shim: str, context_file: str, worker: str, command: str, environ: dict) -> subprocess.Popen:
    """Run ``command`` (``/bin/sh -c``) inside ``worker`` through the backend's exec channel.

    Works for every transport: it is ``mpilaunch-rsh WORKER COMMAND`` with
    ``$MPILAUNCH_CONTEXT`` pointing at the job's context file.  The handle's
    stdin/stdout/stderr are the remote command's; its exit status is the
    remote one (255: the channel failed); SIGTERM is relayed to the remote
    side, which is hung up on a few seconds later.
    """
    return subprocess.Popen(
        [shim, worker, command],
        env={**environ, env_names.CONTEXT: context_file},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C reaches mpilaunch only; it stops tasks in order
    )


# ------------------------------------------------------------------ one task


@dataclass
class TaskRun:
    task: Task
    worker: str
    proc: subprocess.Popen | None = None
    address: str | None = None
    started: float | None = None  # monotonic: when it got the ClusterSpec
    ended: float | None = None
    exit_code: int | None = None
    stopping: bool = False
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reported: threading.Event = field(default_factory=threading.Event)
    pumps: list = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.proc is None:
            return "not started"
        if self.exit_code is None:
            return "running"
        if self.exit_code == 0:
            return "succeeded"
        if self.stopping:
            return "terminated"
        return "failed"

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return round((self.ended or now) - self.started, 3)

    def poll(self, now: float) -> int | None:
        if self.proc is not None and self.exit_code is None:
            code = self.proc.poll()
            if code is not None:
                self.exit_code = code if code >= 0 else 128 - code
                self.ended = now
        return self.exit_code


class TaskOutput:
    """Echo each task's output with a ``[type:index]`` prefix, keep tails and logs."""

    def __init__(self, stdout, stderr, output_dir: Path | None):
        self.echo = {"stdout": stdout, "stderr": stderr}
        self.output_dir = output_dir
        self._logs: dict[Task, object] = {}
        self._lock = threading.Lock()

    def feed(self, run: TaskRun, stream: str, text: str) -> None:
        with self._lock:
            echo_line(self.echo, stream, f"[{run.task.id}] {text}\n")
            run.tail.append(text)
            if self.output_dir is not None:
                log = self._logs.get(run.task)
                if log is None:
                    log = self._logs[run.task] = open(self.output_dir / run.task.log_name(), "a", encoding="utf-8")
                log.write(text + "\n")
                log.flush()

    def pump(self, run: TaskRun, stream: str, pipe) -> threading.Thread:
        def loop():
            for raw in iter(pipe.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\n")
                if stream == "stdout" and not run.reported.is_set() and text.startswith(ADDRESS_PREFIX):
                    run.address = text[len(ADDRESS_PREFIX) :].strip()
                    run.reported.set()
                    continue
                self.feed(run, stream, text)
            pipe.close()

        thread = threading.Thread(target=loop, name=f"pump-{run.task.id}-{stream}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()


# ------------------------------------------------------------------ dry run


def print_dry_run(spec, ps_plan: PsPlan, backend, script, environ, stream) -> None:
    tasks = ps_plan.tasks
    addresses = clusterspec.placeholder_addresses(tasks, ps_plan.job_name)
    cluster = clusterspec.cluster_spec(tasks, addresses)
    print(f"# mpilaunch plan for PS job {ps_plan.job_name} (dry run: nothing is created)", file=stream)
    print(f"backend: {spec.backend}", file=stream)
    print(f"tasks: {len(tasks)}, one container each", file=stream)
    for t in tasks:
        print(f"  {t.id}: {ps_plan.worker(t)}", file=stream)
    print("cluster spec (PORT: reserved by each task starter at run time):", file=stream)
    for line in json.dumps(cluster, indent=2).splitlines():
        print(f"  {line}", file=stream)
    for t in tasks:
        print(f"task {t.id}:", file=stream)
        print(f"  command: {starter_command(spec, t, backend)}", file=stream)
        env = task_message(spec, cluster, t, environ, None)["env"]
        if script:
            env["DTF_TASK_SCRIPT"] = f"<task dir>/{script['name']}"
        for key in sorted(env):
            print(f"  {key}={shlex.quote(env[key])}", file=stream)
    print_manifests(backend, stream)


# ------------------------------------------------------------------ run


def _wait_registered(runs: list[TaskRun], deadline: float, progress) -> None:
    """Until every starter reported its address (the launcher is the registry)."""
    total = len(runs)
    while True:
        now = time.monotonic()
        for run in runs:
            if not run.reported.is_set() and run.poll(now) is not None:
                for pump in run.pumps:
                    pump.join(timeout=2)
                tail = list(run.tail)[-1] if run.tail else "no output"
                raise AllocationError(
                    f"task {run.task.id} on {run.worker} exited with code {run.exit_code} "
                    f"before it reported its port: {tail}",
                    "check that mpilaunch is installed for the worker's Python",
                )
        ready = sum(run.reported.is_set() for run in runs)
        progress(ready, total)
        if ready == total:
            return
        if now > deadline:
            missing = [r.task.id for r in runs if not r.reported.is_set()]
            raise AllocationError(
                f"{len(missing)} of {total} tasks did not report a port before --start-timeout: {', '.join(missing[:5])}",
                "raise --start-timeout, or check the machine's load",
            )
        time.sleep(POLL / 2)


def _send(run: TaskRun, message: dict, now: float) -> None:
    try:
        run.proc.stdin.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
        run.proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # the starter is gone; the life cycle sees its exit
    run.started = now


def _life_cycle(runs: list[TaskRun], deadline: float | None, timeout: float | None) -> tuple[int, str | None]:
    """Exit code and failure text, per YARN-DTF's life cycle."""
    decisive = set(clusterspec.decisive_tasks([r.task for r in runs]))
    while True:
        now = time.monotonic()
        for run in runs:
            code = run.poll(now)
            if code is not None and code != 0 and clusterspec.fails_job(run.task):
                return code, f"task {run.task.id} on {run.worker} exited with code {code}"
        if all(r.exit_code == 0 for r in runs if r.task in decisive):
            return 0, None
        if deadline is not None and now >= deadline:
            return EXIT_TIMEOUT, timeout_failure(timeout)
        time.sleep(POLL)


def _stop_all(runs: list[TaskRun]) -> None:
    """Stop every task still running: EOF to its starter, then signals, then kill."""
    live = [r for r in runs if r.proc is not None and r.poll(time.monotonic()) is None]
    for run in live:
        run.stopping = True
        try:
            run.proc.stdin.close()
        except OSError:
            pass
    _wait_exit(live, time.monotonic() + STOP_WAIT)
    live = [r for r in live if r.exit_code is None]
    for run in live:
        try:
            os.killpg(run.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _wait_exit(live, time.monotonic() + SIGNAL_WAIT)
    for run in live:
        if run.exit_code is None:
            kill_tree(run.proc.pid)
            run.proc.wait()
            run.poll(time.monotonic())
    for run in runs:
        if run.proc is not None and run.proc.stdin and not run.proc.stdin.closed:
            try:
                run.proc.stdin.close()
            except OSError:
                pass


def _wait_exit(runs: list[TaskRun], deadline: float) -> None:
    while any(r.poll(time.monotonic()) is None for r in runs) and time.monotonic() < deadline:
        time.sleep(POLL / 2)


# ------------------------------------------------------------------ report


def _failure_text(head: str | None, failed: list[TaskRun]) -> str:
    lines = [head or f"{len(failed)} task(s) failed"]
    for run in failed:
        tail = list(run.tail)
        if tail:
            lines.append(f"last {len(tail)} lines of {run.task.id} (exit {run.exit_code}):")
            lines += ["  | " + t for t in tail]
        else:
            lines.append(f"{run.task.id} exited with code {run.exit_code} and printed nothing")
    return "\n".join(lines)


def _report(spec, ps_plan: PsPlan, runs, cluster, result: JobResult, workers: dict, tensorboard_url) -> dict:
    now = time.monotonic()
    return {
        "job": ps_plan.job_name,
        "mode": "ps",
        "backend": spec.backend,
        "command": list(spec.command),
        "plan": ps_plan.plan.to_dict(),
        "cluster": cluster,
        "tensorboard": tensorboard_url,
        "tasks": [
            {
                "task": r.task.id,
                "type": r.task.type,
                "index": r.task.index,
                "worker": r.worker,
                "address": r.address,
                "status": r.status,
                "exit_code": r.exit_code,
                "duration_s": r.duration(now),
                "tail": list(r.tail) if r.status == "failed" else [],
            }
            for r in runs
        ],
        "workers": workers,
        "exit_code": result.exit_code,
        "failure": result.failure,
        "timings": result.timings,
    }


# ------------------------------------------------------------------ the workload


class PsWorkload(Workload):
    """One task starter per container; the job ends by YARN-DTF's rules (module docstring)."""

    can_use_cluster_launcher = False  # the registry every task reports to is this mpilaunch

    mode = "ps"

    def __init__(self, spec: JobSpec, job_name: str, ps_plan: PsPlan, script: dict | None):
        super().__init__(spec, job_name, ps_plan.plan)
        self.ps_plan = ps_plan
        self.script = script
        self.runs = [TaskRun(task=t, worker=ps_plan.worker(t)) for t in ps_plan.tasks]
        self.output: TaskOutput | None = None
        self.cluster: dict = {}
        self.tensorboard_url: str | None = None

    @classmethod
    def prepare(cls, spec: JobSpec, backend_cls, job_name: str, environ: dict) -> "PsWorkload":
        ps_plan = make_ps_plan(spec, job_name)
        return cls(spec, job_name, ps_plan, read_script(spec.ps.script))

    def print_dry_run(self, backend, environ: dict, stream) -> None:
        print_dry_run(self.spec, self.ps_plan, backend, self.script, environ, stream)

    def waiting_for(self) -> str:
        return f"waiting for {len(self.runs)} task containers"

    def start(self, run: RunContext) -> None:
        spec, runs = self.spec, self.runs
        self.output = TaskOutput(run.stdout, run.stderr, run.output_dir)
        shim = shim_path(run.rundir)
        t_reg = time.monotonic()
        for task_run in runs:
            task_run.proc = exec_in_worker(
                shim,
                str(run.context_file),
                task_run.worker,
                starter_command(spec, task_run.task, run.backend),
                run.environ,
            )
            task_run.pumps = [
                self.output.pump(task_run, "stdout", task_run.proc.stdout),
                self.output.pump(task_run, "stderr", task_run.proc.stderr),
            ]
        with WaitProgress(f"waiting for {len(runs)} task ports", run.stderr, quiet=run.quiet) as progress:
            _wait_registered(runs, t_reg + spec.start_timeout, progress)
        run.result.timings["register_s"] = round(time.monotonic() - t_reg, 3)

        addresses = {task_run.task: task_run.address for task_run in runs}
        self.cluster = clusterspec.cluster_spec(self.ps_plan.tasks, addresses)
        t_run = time.monotonic()
        for task_run in runs:
            _send(task_run, task_message(spec, self.cluster, task_run.task, run.environ, self.script), t_run)
            if task_run.task.type == clusterspec.TENSORBOARD:
                self.tensorboard_url = f"http://{task_run.address}/"
                print(
                    f"mpilaunch: TensorBoard for {spec.ps.output_path}: {self.tensorboard_url}",
                    file=run.stderr,
                    flush=True,
                )

    def watch(self, run: RunContext, deadline: float | None) -> tuple[int, str | None]:
        return _life_cycle(self.runs, deadline, self.spec.timeout)

    def stop(self) -> None:
        _stop_all(self.runs)
        for task_run in self.runs:
            for pump in task_run.pumps:
                pump.join(timeout=5)

    def close(self) -> None:
        if self.output is not None:
            self.output.close()

    def collect(self, run: RunContext) -> None:
        failed = [r for r in self.runs if r.status == "failed"]
        if failed and run.result.exit_code != 0:
            run.result.failure = _failure_text(run.result.failure, failed)

    def report(self, run: RunContext, workers: dict) -> dict:
        return _report(self.spec, self.ps_plan, self.runs, self.cluster, run.result, workers, self.tensorboard_url)

    def units_on(self, worker: str) -> str | None:
        tasks = [r.task.id for r in self.runs if r.worker == worker]
        return f"task {', '.join(tasks)}" if tasks else None
