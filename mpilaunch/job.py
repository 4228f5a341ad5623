"""The one orchestration path: plan, allocate, launch, watch, tear down.

Every backend goes through :func:`run_spec`. Teardown lives in one
``finally`` so success, rank failure, Ctrl-C, SIGTERM, timeouts and crashes
all release the same things.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, gpu_slots, hostfile, mpi
from .errors import EXIT_INTERRUPTED, Interrupted, MpilaunchError, UsageError
from .output import RankOutput
from .procs import terminate_group
from .progress import WaitProgress
from .spec import JobSpec, Plan, WorkerPlan

EXIT_TIMEOUT = 124
FAIL_FAST_GRACE_S = 5.0
DONE_GRACE_S = 15.0
SHIM_NAME = "mpilaunch-rsh"


@dataclass
class RankStatus:
    rank: int
    worker: str
    exit_code: int | None  # None: the rank never reported (killed, never started)


@dataclass
class JobResult:
    job_name: str
    exit_code: int
    ranks: list[RankStatus] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    output_dir: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# ------------------------------------------------------------------ planning


def job_name_for(spec: JobSpec) -> str:
    return spec.name or f"mpl-{secrets.token_hex(3)}"


def plan_from_hostfile(job_name: str, path: str, np: int | None) -> Plan:
    hosts = hostfile.read(path)
    total = sum(slots for _, slots in hosts)
    if np is not None and np > total:
        raise UsageError(f"--np {np} exceeds the {total} slots of {path}", f"use --np {total} or fewer")
    remaining = total if np is None else np
    workers = []
    for host, slots in hosts:
        if remaining <= 0:
            break
        take = min(slots, remaining)
        workers.append(WorkerPlan(name=host, slots=take, gpus=0))
        remaining -= take
    return Plan(job_name=job_name, workers=tuple(workers))


def make_plan(spec: JobSpec, backend_cls, job_name: str) -> Plan:
    if spec.hostfile:
        if spec.gpus is not None:
            raise UsageError("--hostfile and --gpus are mutually exclusive", "size the job with the hostfile's slots")
        return plan_from_hostfile(job_name, spec.hostfile, spec.np)
    discovered = None
    if spec.gpus is not None and spec.gpus_per_node is None:
        discovered = backend_cls.discover_gpus_per_node(spec)
    return gpu_slots.plan_job(
        job_name, gpus=spec.gpus, gpus_per_node=spec.gpus_per_node, np=spec.np,
        slots_per_worker=spec.slots_per_worker, discovered_gpus_per_node=discovered,
    )


def shim_path(rundir: Path) -> str:
    """The shim mpirun will call: a per-job launcher that starts Python with -IS.

    mpirun starts one shim per worker; skipping ``site`` keeps each start near
    the bare interpreter's cost (site-packages .pth files can add tens of ms).
    """
    from .rsh_agent.shim import write_launcher

    return write_launcher(str(rundir / SHIM_NAME))


def rank_command(spec: JobSpec, prefix: list[str]) -> list[str]:
    wrapper = prefix + (["--bind-gpus"] if spec.bind_gpus else []) + ["--"]
    return wrapper + list(spec.command)


def build_launch(spec, plan, info, rundir: Path, backend, environ) -> tuple[str, mpi.MpirunCommand]:
    hosts = backend.hostnames()
    text = hostfile.render([(hosts[w.name], w.slots) for w in plan.workers], info.hostfile_flavour)
    command = mpi.build_mpirun(
        info,
        ranks=plan.ranks,
        hosts=len(plan.workers),
        hostfile=str(rundir / "hostfile"),
        shim=shim_path(rundir),
        command=rank_command(spec, backend.rank_prefix()),
        environ=environ,
        user_env=spec.env,
        extra_args=spec.mpi_args,
        as_root=os.geteuid() == 0,
    )
    command.env["MPILAUNCH_CONTEXT"] = str(rundir / "context.json")
    return text, command


def prepare_output_dir(spec: JobSpec) -> Path | None:
    """--output-dir, created up front so a typo fails before anything is allocated."""
    if not spec.output_dir:
        return None
    output_dir = Path(spec.output_dir)
    if not spec.dry_run:
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create --output-dir {output_dir}: {e.strerror}", "choose a writable directory") from None
    return output_dir


def make_rundir(job_name: str) -> Path:
    """Private per-job directory: secret, context file, hostfile, shim launcher."""
    rundir = Path(tempfile.mkdtemp(prefix=f"mpilaunch-{job_name}-"))
    os.chmod(rundir, 0o700)
    return rundir


def finish_backend(backend, result: "JobResult") -> dict:
    """Tell the backend how the job ended (YARN final status), collect worker facts, release everything."""
    extra = backend.job_finished(result.exit_code, result.failure)
    if extra and result.failure:
        result.failure = f"{result.failure}\n{extra}"
    workers = backend.describe_workers()
    backend.release()
    return workers


def print_manifests(backend, stream) -> None:
    render = getattr(backend, "render", None)
    if render is not None:
        print("manifests:", file=stream)
        print(render(), file=stream)


# ------------------------------------------------------------------ signals


@contextmanager
def interrupts_raise():
    """SIGINT/SIGTERM/SIGHUP raise Interrupted in the main thread (so finally blocks run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}", "all workers were released")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def ignore_interrupts():
    """During teardown a second Ctrl-C must not abort the cleanup itself."""
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)


# ------------------------------------------------------------------ outcome


def rank_statuses(plan: Plan, output: RankOutput, mpirun_code: int | None) -> list[RankStatus]:
    """Per-rank exit codes from the wrappers' status lines.

    A rank whose line never arrived gets None, except after mpirun exited 0:
    every MPI flavour's mpirun fails when any rank does, so all ranks exited 0.
    """
    reported = {rank: (worker, code) for rank, worker, code in output.statuses}
    assigned = plan.rank_to_worker()
    missing = 0 if mpirun_code == 0 else None
    return [
        RankStatus(rank=r, worker=reported.get(r, (assigned[r], missing))[0],
                   exit_code=reported.get(r, (assigned[r], missing))[1])
        for r in range(plan.ranks)
    ]


def decide_outcome(mpirun_code: int, output: RankOutput) -> tuple[int, tuple[int, str, int] | None]:
    """Exit code of the job: the first failing rank's code, else mpirun's."""
    first_failure = next((s for s in output.statuses if s[2] != 0), None)
    if first_failure is not None:
        return first_failure[2], first_failure
    return mpirun_code, None


def failure_message(failure, output: RankOutput, mpirun_code: int) -> str:
    if failure is not None:
        rank, worker, code = failure
        head = f"rank {rank} on worker {worker} exited with code {code}"
        tail = list(output.tails.get(rank, []))
    else:
        head = f"mpirun exited with code {mpirun_code} before any rank failed"
        cause = mpi.daemon_error(output.launcher_head)
        if cause:
            head += f"; MPI daemon {cause}"
        tail = list(output.launcher_tail)
    lines = [head]
    if tail:
        lines.append(f"last {len(tail)} lines of {'rank ' + str(failure[0]) if failure else 'mpirun'}:")
        lines += ["  | " + t for t in tail]
    return "\n".join(lines)


# ------------------------------------------------------------------ dry run


def print_dry_run(spec, plan, info, hostfile_text, command, backend, stream) -> None:
    print(f"# mpilaunch plan for job {plan.job_name} (dry run: nothing is created)", file=stream)
    print(f"backend: {spec.backend}", file=stream)
    print(f"mpi: {info.flavour} {info.version} ({info.path})", file=stream)
    print(f"ranks: {plan.ranks} on {len(plan.workers)} workers", file=stream)
    for w in plan.workers:
        print(f"  {w.name}: slots={w.slots} gpus={w.gpus}", file=stream)
    print("hostfile:", file=stream)
    for line in hostfile_text.splitlines():
        print(f"  {line}", file=stream)
    print("mpirun:", file=stream)
    print(f"  {command.shell()}", file=stream)
    print("environment:", file=stream)
    for key in sorted(command.env):
        print(f"  {key}={shlex.quote(command.env[key])}", file=stream)
    print_manifests(backend, stream)


# ------------------------------------------------------------------ run


def write_report(path: Path, spec, plan, result: JobResult, workers: dict) -> None:
    report = {
        "job": plan.job_name,
        "backend": spec.backend,
        "command": list(spec.command),
        "plan": plan.to_dict(),
        "workers": workers,
        "exit_code": result.exit_code,
        "failure": result.failure,
        "ranks": [r.__dict__ for r in result.ranks],
        "timings": result.timings,
    }
    path.write_text(json.dumps(report, indent=2) + "\n")


def run_spec(spec: JobSpec, *, stdout=None, stderr=None, environ=None, quiet=False) -> JobResult:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    environ = dict(os.environ if environ is None else environ)
    if spec.mode == "ps":
        from .ps_job import run_ps

        return run_ps(spec, stdout=stdout, stderr=stderr, environ=environ, quiet=quiet)
    backend_cls = backends.load(spec.backend)
    job_name = job_name_for(spec)
    plan = make_plan(spec, backend_cls, job_name)
    try:
        info = mpi.find_mpirun(spec.mpi, spec.mpirun, environ.get("PATH"))
    except UsageError:
        # a launcher in the cluster uses the image's mpirun: none is needed here
        info = getattr(backend_cls, "remote_mpi_info", lambda _spec: None)(spec)
        if info is None:
            raise
    output_dir = prepare_output_dir(spec)
    rundir = make_rundir(job_name)
    backend = backend_cls(spec, plan, rundir)
    hostfile_text, command = build_launch(spec, plan, info, rundir, backend, environ)
    if spec.dry_run:
        print_dry_run(spec, plan, info, hostfile_text, command, backend, stdout)
        remove_tree(rundir)
        return JobResult(job_name=job_name, exit_code=0)

    result = JobResult(job_name=job_name, exit_code=1, output_dir=str(output_dir) if output_dir else None)
    output = RankOutput(stdout, stderr, output_dir)
    timings = result.timings
    t0 = time.monotonic()
    proc = None
    mpirun_code = None
    try:
        with interrupts_raise():
            backend.allocate()
            with WaitProgress(f"waiting for {len(plan.workers)} worker" + ("s" if len(plan.workers) > 1 else ""), stderr, quiet=quiet) as progress:
                backend.wait_ready(t0 + spec.start_timeout, progress)
            timings["allocate_s"] = round(time.monotonic() - t0, 3)
            (rundir / "hostfile").write_text(hostfile_text)
            context = {"job": job_name, **backend.exec_context()}
            (rundir / "context.json").write_text(json.dumps(context))

            t_launch = time.monotonic()
            deadline = None if spec.timeout is None else t_launch + spec.timeout
            if getattr(backend, "launcher_in_cluster", False):
                # mpirun runs in a launcher pod (k8s); the backend streams its output into ``output``
                mpirun_code = backend.run_launcher(output, deadline)
            else:
                proc = subprocess.Popen(
                    command.argv, env={**environ, **command.env}, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )
                pumps = [output.pump("stdout", proc.stdout), output.pump("stderr", proc.stderr)]
                mpirun_code = _wait(proc, deadline, output, plan.ranks)
                for p in pumps:
                    p.join(timeout=10)
            timings["run_s"] = round(time.monotonic() - t_launch, 3)
            if mpirun_code is None:
                result.exit_code = EXIT_TIMEOUT
                result.failure = f"the job ran past --timeout {spec.timeout:g}s and was stopped"
            else:
                result.exit_code, failure = decide_outcome(mpirun_code, output)
                if result.exit_code != 0:
                    result.failure = failure_message(failure, output, mpirun_code)
    except MpilaunchError as e:
        result.exit_code = e.exit_code
        result.failure = e.message
        if not isinstance(e, Interrupted):
            raise
    finally:
        ignore_interrupts()
        if proc is not None and proc.poll() is None:
            terminate_group(proc.pid)
        workers = finish_backend(backend, result)
        output.close()
        timings["total_s"] = round(time.monotonic() - t0, 3)
        result.ranks = rank_statuses(plan, output, mpirun_code)
        if output_dir is not None:
            write_report(output_dir / "report.json", spec, plan, result, workers)
        remove_tree(rundir)
        restore_default_signals()
    return result


def _wait(proc: subprocess.Popen, deadline: float | None, output: RankOutput, ranks: int) -> int | None:
    """mpirun's exit code, or None when the deadline passed (the caller kills it).

    Fail fast: once a rank has failed, mpirun gets FAIL_FAST_GRACE_S to end the
    job itself. Open MPI does; MPICH's hydra waits for every other rank when
    the failed one never called MPI_Abort, which can be forever.
    Done is done: once every rank has reported exit 0, mpirun gets
    DONE_GRACE_S to tear its daemons down (seen: Open MPI 5 on a loaded
    machine stalling there after all ranks finished); the job succeeded.
    """
    failed_at = None
    done_at = None
    while True:
        timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if failed_at is None and any(code != 0 for _, _, code in output.statuses):
                failed_at = now
            if failed_at is not None and now - failed_at > FAIL_FAST_GRACE_S:
                terminate_group(proc.pid)
                return proc.wait()
            if done_at is None and failed_at is None and len({r for r, _, _ in output.statuses}) >= ranks:
                done_at = now
            if done_at is not None and now - done_at > DONE_GRACE_S:
                terminate_group(proc.pid)
                proc.wait()
                return 0


def restore_default_signals():
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)


def remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["run_spec", "JobResult", "RankStatus", "EXIT_INTERRUPTED"]
