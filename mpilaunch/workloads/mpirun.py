"""The mpirun workload: one mpirun over all workers, its ranks judged by their status lines.

Planning (GPUs or a hostfile -> workers x slots), the mpirun command, the
rank-output watch and the outcome (first failing rank, else mpirun's code).
The steps around it (allocate, wait, release, signals, report file) are the
lifecycle's (``lifecycle.py``). The in-cluster launchers run this same
workload (``backends/<name>/launcher.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..backends import protocols
from ..backends.base import hostnames
from ..core import env_names, envcheck, gpu_slots, hostfile, inherited, mpi, placement, program_check, rank_filter
from ..core.errors import UsageError
from ..core.exit_codes import EXIT_INTERRUPTED, EXIT_PLACEMENT, EXIT_PREFLIGHT, EXIT_TIMEOUT
from ..core.rank_lines import new_token
from ..core.result import JobResult, number_ranges, timeout_failure
from ..core.spec import JobSpec, Plan, WorkerPlan, check_plan_size
from ..rsh_agent.shim import EXITS_DIR, failed_agents, uses_agents
from ..runtime import record
from ..runtime.output import RankOutput
from ..runtime.procs import end_leftover_group, kill_session_leftovers, terminate_group, wait_exit
from . import program_probe
from .base import RunContext, Workload, print_manifests
from .mpirun_command import build_launch, expected_environment, without_stale_session
from .mpirun_outcome import (  # noqa: F401
    ENDED_BY_TEARDOWN,
    FAIL_FAST_GRACE_S,
    NEVER_STARTED,
    daemon_failure_message,
    decide_outcome,
    failure_message,
    mpirun_named_first,
    other_failures,
    rank_statuses,
    unobserved_reason,
)
from .verification import placement_watch, verify_placement

DONE_GRACE_S = 15.0
# How long mpirun's output threads may take to reach EOF once mpirun has ended (each):
# a process that left mpirun's group may still hold a pipe
PUMP_DRAIN_S = 10.0
# how long mpirun's process group may hold its pipes open after mpirun ended (its shims' last words);
# none after a lost worker: the shims left then wait on the daemons of a broken run (in process
# groups of their own: Open MPI's doing) and held the relaunch onto a spare back 1.05 s (seen in a
# launcher pod's log: the surviving worker's shim, its pgid its own, held mpirun's pipes until its
# orted noticed mpirun was gone). SIGKILLed, a shim's agent ends its session all the same.
GROUP_LINGER_S = 0.5
# how long a stopped mpirun has to end on SIGTERM (its ranks that handle it get it), before SIGKILL;
# after a lost worker much less: Open MPI 4.1's mpirun then waits for the lost daemon and used all
# 5 s in one stop of three on real pods (seen), holding the --retries relaunch back
STOP_GRACE_S = 5.0
BROKEN_STOP_GRACE_S = 0.5
STOPPED = "mpirun was stopped by mpilaunch"  # how report.json's ``unobserved`` reasons begin


# ------------------------------------------------------------------ planning


def plan_from_hostfile(job_name: str, path: str, np: int | None) -> Plan:
    hosts = hostfile.read(path)
    total = sum(slots for _, slots in hosts)
    if np is not None and np > total:
        raise UsageError(f"--np {np} exceeds the {total} slots of {path}", f"use --np {total} or fewer")
    remaining = total if np is None else np
    check_plan_size(remaining, 0, f"--hostfile {path}")  # ranks; Plan counts the workers
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
        discovery = backend_cls.options_class.discover_gpus(spec)
        warning = gpu_slots.fallback_warning(discovery)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        if spec.gpus >= 1:  # below 1: plan_job's own error
            gpu_slots.check_capacity(spec.gpus, discovery)
        discovered = discovery.per_node
    return gpu_slots.plan_job(
        job_name,
        gpus=spec.gpus,
        gpus_per_node=spec.gpus_per_node,
        np=spec.np,
        slots_per_worker=spec.slots_per_worker,
        discovered_gpus_per_node=discovered,
    )


# ------------------------------------------------------------------ dry run


def print_dry_run(spec, plan, info, hostfile_text, command, backend, stream) -> None:
    print(f"# mpilaunch plan for job {plan.job_name} (dry run: nothing is created)", file=stream)
    print(f"backend: {spec.backend}", file=stream)
    print(f"mpi: {info.flavour} {info.version} ({info.path})", file=stream)
    print(f"ranks: {plan.ranks} on {len(plan.workers)} workers", file=stream)
    print(f"verify placement: {'yes' if spec.verify else 'no (--no-verify)'}", file=stream)
    for w in plan.workers:
        print(f"  {w.name}: slots={w.slots} gpus={w.gpus}", file=stream)
    print("hostfile:", file=stream)
    for line in hostfile_text.splitlines():
        print(f"  {line}", file=stream)
    print("mpirun:", file=stream)
    print(f"  {command.shell()}", file=stream)
    print(
        "torch.distributed: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK per rank; "
        "MASTER_ADDR/MASTER_PORT on worker 0, chosen at launch",
        file=stream,
    )
    # the forwarded values travel in mpirun's environment, not on its command line; shown masked
    print("environment (forwarded values masked):", file=stream)
    shown = command.shown_env()
    for key in sorted(shown):
        print(f"  {key}={shown[key]}", file=stream)
    print_manifests(backend, stream)


def _wait(
    proc: subprocess.Popen, deadline: float | None, output: RankOutput, ranks: int, failed_agents=lambda: []
) -> tuple[int | None, tuple[str, int] | None, str | None]:
    """``(mpirun's exit code, daemon, stopped)``: ``daemon`` is ``(worker, agent's
    exit code)`` when mpilaunch ended an mpirun that kept waiting for a daemon
    that had failed; ``stopped`` says why mpilaunch stopped mpirun before every
    rank had reported (None: it ended by itself, or after every rank reported).
    The code is None when the deadline passed (the caller kills it).

    Fail fast: once a rank has failed, mpirun gets FAIL_FAST_GRACE_S to end the
    job itself. Open MPI does; MPICH's hydra waits for every other rank when
    the failed one never called MPI_Abort, which can be forever.
    Done is done: once every rank has reported exit 0, mpirun gets
    DONE_GRACE_S to tear its daemons down (seen: Open MPI 5 on a loaded
    machine stalling there after all ranks finished); the job succeeded.
    A failed daemon fails the job: once a daemon's agent has ended non-zero
    (``failed_agents``, the shim's notes) while ranks are still to come,
    mpirun gets FAIL_FAST_GRACE_S to end the job itself. Open MPI does;
    MPICH's and Intel MPI's hydra ignore their launcher's exit and wait for a
    proxy that never connects back, forever.
    """
    failed_at = done_at = daemon_failed_at = failed_rank = None
    while True:
        timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
        try:
            return wait_exit(proc, timeout), None, None
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None, None, None
            if output.misplaced() is not None:
                # ranks run elsewhere than planned: no point letting them go on
                return terminate_group(proc), None, f"{STOPPED} after the placement check failed"
            if failed_at is None:
                failed = next((s for s in output.statuses if s[2] != 0), None)
                if failed is not None:
                    failed_at, failed_rank = now, failed[0]
            if failed_at is not None and now - failed_at > FAIL_FAST_GRACE_S:
                return terminate_group(proc), None, f"{STOPPED} after rank {failed_rank} failed"
            if done_at is None and failed_at is None and len({r for r, _, _ in output.statuses}) >= ranks:
                done_at = now
            if done_at is not None and now - done_at > DONE_GRACE_S:
                terminate_group(proc)
                return 0, None, None
            if failed_at is None and done_at is None:
                agents = failed_agents()
                if agents and daemon_failed_at is None:
                    daemon_failed_at = now
                if agents and now - daemon_failed_at > FAIL_FAST_GRACE_S:
                    return (
                        terminate_group(proc),
                        agents[0],
                        f"{STOPPED} after the MPI daemon on worker {agents[0][0]} failed",
                    )


# ------------------------------------------------------------------ output of a launcher in the cluster


class _Discard:
    def write(self, _text) -> None:
        pass

    def flush(self) -> None:
        pass


class RelayedOutput(RankOutput):
    """mpirun's lines handed on untouched (``relay(stream, line)``), rank statuses still read here.

    An in-cluster launcher relays its mpirun's output to the submitting side,
    which parses it for the user; the launcher itself only needs the statuses
    for fail-fast and for its exit code.
    """

    def __init__(self, relay):
        super().__init__(_Discard(), _Discard())
        self.relay = relay

    def feed(self, stream: str, line: str) -> None:
        self.relay(stream, line)
        super().feed(stream, line)


# ------------------------------------------------------------------ report


def mpirun_report(spec, plan, result: JobResult, workers: dict, info=None, rank_times=None) -> dict:
    clock = rank_clock(rank_times or {})
    return {
        "job": plan.job_name,
        "backend": spec.backend,
        "command": list(spec.command),
        "mpi": None if info is None else {"flavour": info.flavour, "version": info.version, "mpirun": info.path},
        "plan": plan.to_dict(),
        "workers": workers,
        "exit_code": result.exit_code,
        "failure": result.failure,
        "ranks": [{**r.__dict__, **clock(r.rank)} for r in result.ranks],
        "placement": result.placement,
        "timings": result.timings,
    }


def rank_clock(rank_times: dict):
    """rank -> its ``started_at``/``ended_at`` (ISO 8601, UTC): when mpilaunch read its wrapper's
    start and status lines (``RankOutput.rank_times``); absent where that line never came."""
    now, wall = time.monotonic(), time.time()

    def clock(rank: int) -> dict:
        out = {}
        for key, at in zip(("started_at", "ended_at"), rank_times.get(rank, (None, None))):
            if at is not None:
                out[key] = record.iso_utc(record.wall_clock(at, now, wall))
        return out

    return clock


# ------------------------------------------------------------------ the workload


def preflight_stop(code: int | None, notes: list[str]) -> str | None:
    """The failure of a job whose in-cluster launcher's --preflight enforce stopped it before its
    program (its exit EXIT_PREFLIGHT and its preflight lines), None otherwise."""
    found = [n for n in notes if n.startswith("mpilaunch: preflight: worker ")]
    if code != EXIT_PREFLIGHT or not found:
        return None
    workers = sorted({n.split("mpilaunch: preflight: worker ", 1)[1].split(" ", 1)[0] for n in found})
    return f"preflight: {len(workers)} workers failed ({', '.join(workers)}); the program was not started"


class MpirunWorkload(Workload):
    """One mpirun (here, or in the cluster's launcher) over every worker's slots."""

    mode = "mpirun"
    broken = False  # the last stop was a broken run's (a lost worker): no linger for its leftovers
    agent_transport = False  # the shims reach mpilaunch's agents (rsh_agent/shim.py uses_agents)

    def __init__(self, spec: JobSpec, job_name: str, plan: Plan, info: mpi.MpiInfo):
        super().__init__(spec, job_name, plan)
        self.info = info
        self.hostfile_text = ""
        self.command: mpi.MpirunCommand | None = None
        self.output: RankOutput | None = None
        self.proc: subprocess.Popen | None = None
        self.bound: tuple | None = None  # (backend, rundir, environ), once bind() ran
        self.pumps: list = []  # the threads reading mpirun's stdout and stderr
        self.mpirun_code: int | None = None
        self.cwd: str | None = None
        self.on_started = None  # called with mpirun's Popen (the YARN launcher publishes its pid)
        self.placement: dict | None = None  # report.json's "placement"
        self.started_at: float | None = None  # mpirun spawned here (not with a launcher in the cluster)
        self.overrides: list[inherited.Override] = []  # the user's settings left out of the launch
        self.warned = False
        self.expected: envcheck.Expected | None = None
        self.environment: dict | None = None  # report.json's "environment"
        self.stopped: str | None = None  # why mpilaunch stopped mpirun before every rank reported (report.json)
        self.stop_reason: str | None = None  # the cause the next stop() records (note_stop)
        # the rank wrappers sign their start and status lines with it (rank.py); an in-cluster
        # launcher takes the submitting side's from its launch description instead
        self.token = new_token()

    @classmethod
    def prepare(cls, spec: JobSpec, backend_cls, job_name: str, environ: dict) -> "MpirunWorkload":
        plan = make_plan(spec, backend_cls, job_name)
        if spec.output_ranks is not None:
            rank_filter.check_against_plan(spec.output_ranks, plan.ranks)
        try:
            info = mpi.find_mpirun(spec.mpi, spec.mpirun, environ.get("PATH"))
        except UsageError:
            # a launcher in the cluster uses the image's mpirun: none is needed here
            info = protocols.remote_mpi_info(backend_cls, spec)
            if info is None:
                raise
        return cls(spec, job_name, plan, info)

    def bind(self, backend, rundir: Path, environ: dict, attempt: int = 1) -> None:
        # settings from the user's shell or image that would choose mpirun's launch: out of the
        # environment of mpirun and of the local workers (in place: the lifecycle's dict)
        kept, overrides = inherited.split(
            environ, self.info.flavour, keep=[item.split("=", 1)[0] for item in self.spec.env]
        )
        if overrides:
            environ.clear()
            environ.update(kept)
            self.overrides = overrides
        backend.launch_environ = environ
        backend.status_token = self.token  # for the launch description of a launcher in the cluster
        backend.own_hostnames = len(self.plan.workers) > 1 and mpi.for_name(self.info.flavour).needs_own_hostnames(
            self.info
        )
        self.bound = (backend, rundir, environ)
        self.attempt = attempt
        self.hostfile_text, self.command = build_launch(
            self.spec, self.plan, self.info, rundir, backend, environ, attempt, token=self.token
        )
        if attempt == 1 and backend.checks_program_here and not self.spec.dry_run:
            # with the PATH the ranks get (-x PATH=... included), in the directory they start in
            path = self.command.forwarded.get("PATH", environ.get("PATH", ""))
            program_check.check_program(list(self.spec.command), path, self.cwd or os.getcwd())
        # a launcher in the cluster checks the ranks against its own mpirun (the image's, not this machine's)
        self.expected = (
            None
            if backend.launcher_in_cluster
            else expected_environment(self.spec, self.info, self.command, backend, environ)
        )

    def check_program(self, run: RunContext) -> None:
        """The first worker has the program, where its ranks do not run this machine's programs
        (the local backend checked here in bind()); program_probe says how it looks."""
        backend = run.backend
        if self.attempt != 1 or backend.checks_program_here or backend.launcher_in_cluster or not self.spec.command:
            return
        from ..hang import collect

        context = json.loads(run.context_file.read_text())
        try:
            captures = collect.captures_of(context)
        except ValueError:  # a transport that cannot capture: the ranks' own line says it
            return
        # the PATH the rank wrapper gives the program (rank_env.restore_worker_path): the user's
        # -x PATH, else the launcher's where the workers are sent it, else the worker's own
        path = self.command.forwarded.get("PATH")
        if path is None and env_names.WORKER_PATH in (context.get("forward_env") or ()):
            path = {**run.environ, **self.command.env}.get(env_names.WORKER_PATH)
        # MPICH's connect-back proxies start in /, and the wrapper goes back to the worker's directory
        worker_cwd = "--worker-cwd" in self.command.argv
        text = program_probe.script(
            self.spec.command[0],
            program_check.python_script(list(self.spec.command)),
            path,
            None if worker_cwd else (self.cwd or os.getcwd()),
            context.get("cwd"),
        )
        refused = program_probe.check_first_worker(captures, self.plan.workers[0].name, list(self.spec.command), text)
        if refused is not None:
            raise refused

    def print_dry_run(self, backend, environ: dict, stream) -> None:
        self.warn_overrides(sys.stderr)
        print_dry_run(self.spec, self.plan, self.info, self.hostfile_text, self.command, backend, stream)
        if self.overrides:
            print("left out of the environment (see the warnings):", file=stream)
            for o in self.overrides:
                print(f"  {o.name}", file=stream)

    def warn_overrides(self, stream) -> None:
        """Each overridden setting named once per job (not again on a --retries relaunch)."""
        if self.overrides and not self.warned:
            self.warned = True
            for line in inherited.warnings(self.overrides):
                print(line, file=stream, flush=True)

    def waiting_for(self) -> str:
        return f"waiting for {len(self.plan.workers)} worker" + ("s" if len(self.plan.workers) > 1 else "")

    def use_output(self, output) -> None:
        """Where mpirun's lines go; the in-cluster launchers pass them on raw (``backends/<name>/launcher.py``)."""
        self.output = output

    def start(self, run: RunContext) -> None:
        self.warn_overrides(run.stderr)
        if self.output is None:
            self.output = RankOutput(run.stdout, run.stderr, run.output_dir, shown_ranks=self.spec.output_ranks)
        self.output.ompi_tag_space = mpi.tag_has_space(self.info)
        self.output.token = self.token
        if self.spec.verify:
            self.output.placement_check = placement_watch(self.plan, self.output, self.expected)
        (run.rundir / "hostfile").write_text(self.hostfile_text)
        if run.backend.launcher_in_cluster:
            return  # mpirun runs in the cluster's launcher; watch() follows it
        # torch.distributed's MASTER_ADDR/MASTER_PORT: a free port on worker 0, known only now
        rendezvous = run.backend.rendezvous(self.plan.workers[0].name)
        if rendezvous is not None:
            backend, rundir, environ = self.bound
            _, self.command = build_launch(
                self.spec, self.plan, self.info, rundir, backend, environ, self.attempt, rendezvous, self.token
            )
        # a relaunch (--retries) must not be ended for the last attempt's failed daemons
        shutil.rmtree(run.rundir / EXITS_DIR, ignore_errors=True)
        self.agent_transport = uses_agents(run.context_file)
        self.proc = subprocess.Popen(
            without_stale_session(self.command.argv, self.info),
            env={**run.environ, **self.command.env},
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        self.pumps = [self.output.pump("stdout", self.proc.stdout), self.output.pump("stderr", self.proc.stderr)]
        if self.on_started is not None:
            self.on_started(self.proc)

    def watch(self, run: RunContext, deadline: float | None) -> tuple[int, str | None]:
        if self.proc is None:
            # the backend streams the launcher's output into ``self.output``
            self.mpirun_code = run.backend.run_launcher(self.output, deadline)
            if self.output.launcher_error is not None:  # found there before mpirun (a program the workers lack)
                raise self.output.launcher_error
            self.output.show_unstarted()  # before the outcome's lines: what the ranks said comes first
            stopped_before = preflight_stop(self.mpirun_code, self.output.launcher_notes)
            if stopped_before is not None:
                return EXIT_PREFLIGHT, stopped_before
        else:
            self.mpirun_code, daemon, stopped = _wait(
                self.proc, deadline, self.output, self.plan.ranks, lambda: failed_agents(str(run.rundir))
            )
            self.stopped = self.stopped or stopped  # or the lost-worker watch's stop(), on its thread
            if self.mpirun_code is not None:
                self._drain_pumps()
            # else --timeout passed with mpirun running: its pipes stay open until stop() ends it,
            # so waiting for them here held the stop back PUMP_DRAIN_S per pipe (20 s in all)
            self.output.show_unstarted()
            if daemon is not None:
                worker, code = daemon
                self.placement = placement.summary(self.plan, self.starts(), None, False)
                return code, daemon_failure_message(worker, code, self.output)
        if self.mpirun_code is None:
            self.stopped = self.stopped or f"{STOPPED} at --timeout {self.spec.timeout:g}s"
            self.placement = placement.summary(self.plan, self.starts(), None, False)
            return EXIT_TIMEOUT, timeout_failure(self.spec.timeout)
        named = mpi.first_failed_rank(list(self.output.launcher_tail))
        self.output.statuses = mpirun_named_first(self.output.statuses, named, self.plan.rank_to_worker())
        verdict = self.verify(run)
        if verdict is not None:
            return verdict
        exit_code, failure = decide_outcome(self.mpirun_code, self.output)
        return exit_code, (
            failure_message(failure, self.output, self.mpirun_code, self.stopped) if exit_code != 0 else None
        )

    def starts(self) -> list[placement.RankStart]:
        return [placement.RankStart.from_tuple(t) for t in self.output.starts]

    def verify(self, run: RunContext) -> tuple[int, str] | None:
        """(exit code, failure) when the ranks ran elsewhere than planned; records the placement."""
        mismatch = unverified = None
        if self.spec.verify and not (self.output.starts or self.output.statuses):
            # nothing to judge by (a launcher whose log never reached us): say so, fail on evidence only
            unverified = "no rank reported where it started (mpirun's output did not reach mpilaunch)"
            if self.mpirun_code == 0:  # after a failed launch, its error says why no rank started
                print(f"mpilaunch: warning: placement not verified: {unverified}", file=run.stderr)
        elif self.spec.verify:
            t0 = time.monotonic()
            # an mpirun that mpilaunch stopped did not end well, whatever its code: no ranks are "missing"
            ended = None if self.stopped else self.mpirun_code
            mismatch, hint = verify_placement(
                self.spec, self.plan, self.info, self.output, ended, hostnames(self.plan), self.expected
            )
            run.result.timings["verify_s"] = round(time.monotonic() - t0, 4)
        env_mismatch = mismatch if mismatch is not None and mismatch.kind in envcheck.KINDS else None
        placed = None if env_mismatch is not None else mismatch
        self.placement = placement.summary(
            self.plan, self.starts(), placed, self.spec.verify and unverified is None, note=unverified
        )
        self.record_environment(env_mismatch, self.spec.verify and unverified is None and placed is None, run.stderr)
        if mismatch is None:
            return None
        # the ranks' own exit codes are moot: they ran somewhere else than planned
        return EXIT_PLACEMENT, f"{mismatch.message}\n  hint: {hint}"

    def record_environment(self, mismatch, enabled: bool, stream) -> None:
        """report.json's ``environment``: each rank's program, MPI library and forwarded-variable digest."""
        if self.expected is None or self.output is None:
            return
        self.environment = envcheck.summary(self.expected, dict(self.output.environments), mismatch, enabled)
        differs = self.environment["env_digest_differs"]
        if differs and enabled:
            print(envcheck.differences_warning(differs, self.environment["env_differs"]), file=stream)

    def phase_times(self) -> dict[str, float]:
        """mpirun started (here; the k8s backend marks a launcher pod's), the first rank's
        start line and output, and ranks_done once every rank reported its exit."""
        times = dict(self.output.times) if self.output is not None else {}
        last = times.pop("last_status", None)
        if last is not None and len({r for r, _, _ in self.output.statuses}) >= self.plan.ranks:
            times["ranks_done"] = last
        if self.started_at is not None:
            times["mpirun_started"] = self.started_at
        return times

    def note_stop(self, why: str, broken: bool = False) -> None:
        self.stop_reason = why
        self.broken = broken

    def stop(self) -> None:
        # recorded before the signal: the watch's wait may see mpirun end before terminate_group returns
        why = f"{STOPPED} {self.stop_reason or 'before it ended'}"
        if self.output is not None:
            in_cluster = self.bound is not None and self.bound[0].launcher_in_cluster
            if in_cluster and self.mpirun_code is None and not self.output.cancelled:
                self.stopped = self.stopped or why  # a launcher in the cluster, still followed
            self.output.cancel()  # a launcher in the cluster: stop following it
        if self.proc is not None and self.proc.poll() is None:
            self.stopped = self.stopped or why
            terminate_group(self.proc, grace=BROKEN_STOP_GRACE_S if self.broken else STOP_GRACE_S)
        self._drain_pumps()

    def _drain_pumps(self) -> None:
        """mpirun's last lines: its pipes reach EOF once it and its process group have ended.

        Once mpirun itself has ended, what is left of its group is ended after GROUP_LINGER_S: a
        shim whose exec stream goes to a pod being deleted holds the pipes open for the pod's
        grace period (seen on real pods: a lost worker's relaunch, with or without a spare, held
        back 4-5 s in one run of three, once 68 s)."""
        until = time.monotonic() + (0.0 if self.broken else GROUP_LINGER_S)
        for p in self.pumps:
            p.join(timeout=max(0.0, until - time.monotonic()))
        if any(p.is_alive() for p in self.pumps) and self.proc is not None and self.proc.poll() is not None:
            end_leftover_group(self.proc.pid, grace=0.0 if self.broken else 1.0)
            if self.broken and self.agent_transport:  # and the shims in groups of their own, which
                kill_session_leftovers(self.proc.pid)  # a group's kill misses: their agents end the rest
        for p in self.pumps:
            p.join(timeout=PUMP_DRAIN_S)

    def close(self) -> None:
        if self.output is not None:
            self.output.close()

    def reset(self, attempt: int) -> None:
        # rank logs are opened for appending: the next attempt's lines follow this one's
        self.close()
        # a launcher in the cluster that relaunches (a spare swapped in) hands its lines on as before
        relay = self.output.relay if isinstance(self.output, RelayedOutput) else None
        self.output = self.proc = self.mpirun_code = self.placement = self.environment = None
        if relay is not None:
            self.output = RelayedOutput(relay)
        self.pumps = []
        self.stopped = self.stop_reason = None
        self.broken = False
        self.bind(*self.bound, attempt=attempt)

    def collect(self, run: RunContext) -> None:
        # never started (allocation failed, interrupted): every rank unreported
        output = self.output or RankOutput(None, None)
        stopped = self.stopped
        if stopped and self.stop_reason is None and run.result.exit_code == EXIT_INTERRUPTED and run.result.failure:
            stopped = f"{STOPPED}: {run.result.failure}"  # "...: interrupted by SIGINT"
        run.result.ranks = rank_statuses(self.plan, output, self.mpirun_code if self.output else None, stopped)
        run.result.placement = self.placement

    def report(self, run: RunContext, workers: dict) -> dict:
        times = self.output.rank_times if self.output is not None else {}
        report = mpirun_report(self.spec, self.plan, run.result, workers, self.info, times)
        return {**report, "environment": self.environment}

    def all_units_reported(self) -> bool:
        # Open MPI 5's prterun can exit 0 after losing a daemon with its ranks: then some never reported
        return self.output is not None and {r for r, _, _ in self.output.statuses} >= set(range(self.plan.ranks))

    def units_on(self, worker: str) -> str | None:
        ranks = [r for r, w in enumerate(self.plan.rank_to_worker()) if w == worker]
        if not ranks:
            return None
        return f"rank{'s' if len(ranks) > 1 else ''} {number_ranges(ranks)}"
