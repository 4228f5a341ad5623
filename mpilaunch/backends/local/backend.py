"""Local backend: one exec agent process per worker on this machine.

Each worker is a real ``mpilaunch agent`` listening on a Unix socket in the
job's private run directory (``agent_socket_address``); mpirun
reaches it through ``mpilaunch-rsh`` exactly as it reaches a YARN
container, so the local backend exercises the whole exec path. Worker host
names (``<job>-worker-<i>``) do not resolve, which is what makes mpirun hand
them to the agent instead of forking locally.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from ...agent.hostname import can_take_hostname
from ...core import env_names, gpu_slots, phases
from ...core.errors import AllocationError
from ...core.pylauncher import write_launcher
from ...runtime.procs import kill_tree, processes_with_env, wait_exit, wait_killed
from ..agent_credential import new_mac_secret
from ..agent_workers import FORWARD_ENV, how_it_ended, silent_agents, write_secret
from ..base import BaseBackend, Capabilities
from ..protocols import ReplacesWorkers
from ..rendezvous import free_port_below_ephemeral
from ..spare_pool import SparePool, served
from .forked import FORK_AGENTS_FROM, ForkedAgent, run_forked_agent
from .options import LocalOptions

# How long a failed run's diagnosis waits for an agent that stopped answering to be reaped.
LOCAL_SETTLE_S = 5.0


# sun_path's 108 bytes, its terminating NUL included
UNIX_PATH_MAX = 107


def agent_socket_address(rundir, index: int) -> str:
    """Where worker ``index``'s agent listens: a Unix socket in the job's run directory.

    The directory is the job owner's alone (0700), so no other local user
    can even connect, and the agent admits its own user only (SO_PEERCRED).
    On loopback TCP every local user could, and all of them shared
    127.0.0.1's one per-peer quota of unauthenticated connections with the
    job's own shims: another user holding those slots held up the launch.
    A run directory too deep for a socket's path (a long ``$TMPDIR``) gets
    a name in Linux's abstract namespace instead, which any local user can
    connect to, and which the agent's uid check then turns away at once.
    """
    path = os.path.join(str(rundir), f"agent-{index}.sock")
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return "unix:" + path
    return f"unix:@mpilaunch-agent-{os.urandom(8).hex()}"


def listening_socket(address: str) -> socket.socket:
    """A socket bound and listening at ``address``, handed to an agent that serves it.

    Its address is known before the agent's interpreter has started, so mpirun
    starts at once: connections wait in the backlog until the agent accepts
    them. Should the agent die, the socket closes with it and the shim's
    connection is refused, which the lost-worker watch then explains.
    """
    from ...agent.cli import listen_unix
    from ...wire.protocol import unix_sockaddr

    return listen_unix(unix_sockaddr(address))


class LocalBackend(BaseBackend, ReplacesWorkers):
    name = "local"
    options_class = LocalOptions
    capabilities = Capabilities(replace_workers=True, spares=True)
    workers_on_this_host = True
    forwards_path = True
    checks_program_here = True

    def __init__(self, spec, plan, rundir, *, cluster_launcher_allowed: bool = True):
        self.check_spec(spec)  # also where no lifecycle checked it (tests, benchmarks)
        super().__init__(spec, plan, rundir, cluster_launcher_allowed=cluster_launcher_allowed)
        self.secret_file = rundir / "secret"
        self.agents: dict[str, subprocess.Popen] = {}
        self.addresses: dict[str, str] = {}
        self.devices: dict[str, list[str]] = {}
        self.job_marker = f"{plan.job_name}-{os.getpid()}-{os.urandom(4).hex()}"
        self.take_hostnames = False  # each agent a host of its worker's name (allocate, agent/hostname.py)
        # --spares: agents beyond the plan, outside the hostfile, until one serves a worker
        self.spares = SparePool.for_plan(plan)
        self.spare_agents: dict[str, subprocess.Popen] = {}
        self.spare_addresses: dict[str, str] = {}
        self.socket_index: dict[str, int] = {w.name: i for i, w in enumerate(plan.workers)}

    def _launcher(self, name: str, module: str) -> str:
        """A per-job ``python -IS`` executable for a module that starts many times (``pylauncher``)."""
        path = self.rundir / name
        if not path.exists():
            write_launcher(str(path), module)
        return str(path)

    def rank_prefix(self) -> list[str]:
        # one wrapper per rank: skip site (see pylauncher); the ranks' own
        # programs still see the full environment
        return [self._launcher("mpilaunch.rank", "mpilaunch.rank")]

    def _agent_argv(self, worker, listen_fd: int) -> list[str]:
        argv = [
            # named like the module: `ps` shows "mpilaunch.agent" as for `python -m mpilaunch.agent`
            self._launcher("mpilaunch.agent", "mpilaunch.agent.cli"),
            "--name",
            worker.name,
            "--listen-fd",
            str(listen_fd),
            "--secret-file",
            str(self.secret_file),
            "--exit-with-pid",
            str(os.getpid()),
            "--orphan-cleanup",
            str(self.rundir),
            "--env",
            f"{env_names.JOB}={self.job_marker}",
            # the job's context for an mpilaunch-rsh started on the worker: Open MPI's tree
            # spawn (--mpi-args "--mca plm_rsh_no_tree_spawn 0") has daemons start daemons
            "--env",
            f"{env_names.CONTEXT}={self.rundir / 'context.json'}",
        ]
        if worker.name in self.devices:
            argv += ["--env", "CUDA_VISIBLE_DEVICES=" + ",".join(self.devices[worker.name])]
        if self.take_hostnames:
            argv += ["--hostname", worker.name]
        return argv

    def allocate(self) -> None:
        spares = [self.spares.new_spare() for _ in range(self.spec.spares)]
        if self.plan.gpus:
            devices = gpu_slots.discover_local_gpus()
            self.devices = gpu_slots.partition_devices(devices, self.plan, spares)
        # every agent here is on a Unix socket (agent_socket_address): the MACs, and no TLS
        write_secret(self.secret_file, new_mac_secret())
        self.take_hostnames = self._can_take_hostnames(spares)
        for worker in self.plan.workers:
            self._start_agent(worker)
        for spare in spares:
            self._start_spare(spare)

    def _start_spare(self, spare) -> None:
        """A spare's agent, waiting outside the hostfile (its own name, host name and GPUs)."""
        self.spare_agents[spare.name], self.spare_addresses[spare.name] = self._spawn_agent(spare)
        self.spares.ready(spare.name)

    def spares_waiting(self) -> int:
        for name in list(self.spares.waiting):  # an agent that died waiting is no spare
            if self.spare_agents[name].poll() is not None:
                self.spares.lost(name)
        return len(self.spares.waiting)

    def _can_take_hostnames(self, spares=()) -> bool:
        """Whether each agent takes its worker's name for host name (``own_hostnames``: the MPI
        tells workers apart by host name, and here they all share this machine's). Tried once
        first; where this machine does not let a process name its host, a warning says what
        goes wrong and the job runs as before."""
        if not self.own_hostnames:
            return False
        why = can_take_hostname(max((w.name for w in (*self.plan.workers, *spares)), key=len))
        if why is None:
            return True
        print(
            f"mpilaunch: warning: this MPI takes the {len(self.plan.workers)} local workers, which share this "
            f"machine's host name, for one node: their ranks disagree about who shares memory with whom "
            f"(MPI_COMM_TYPE_SHARED; Horovod's MPI controller hangs in hvd.init()); mpilaunch could not give "
            f"each worker a host name of its own: {why}\n"
            f"  hint: run mpilaunch as root or where users may make user namespaces (sysctl "
            f"kernel.unprivileged_userns_clone=1; Ubuntu: kernel.apparmor_restrict_unprivileged_userns=0), or "
            f"put every rank on one worker (--slots-per-worker), or use Open MPI 4.1, MPICH or Horovod's Gloo controller",
            file=sys.stderr,
            flush=True,
        )
        return False

    def _start_agent(self, worker) -> None:
        phases.mark_worker(self.worker_times, worker.name, "created")
        self.agents[worker.name], self.addresses[worker.name] = self._spawn_agent(worker)

    def _spawn_agent(self, worker):
        """(the agent's process, its address) for ``worker`` (of the plan, or a spare)."""
        log = open(self.rundir / f"{worker.name}.agent.log", "ab")
        index = self.socket_index.setdefault(worker.name, len(self.socket_index))
        address = agent_socket_address(self.rundir, index)
        with listening_socket(address) as listener:
            # Own session: a Ctrl-C at the terminal reaches mpilaunch only,
            # which then tears the workers down in order.
            if self._fork_agents():
                argv = self._agent_argv(worker, 3)  # the child moves the listener to fd 3
                env = dict(os.environ if self.launch_environ is None else self.launch_environ)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    run_forked_agent(argv[1:], env, listener.fileno(), log.fileno())
                agent = ForkedAgent(pid, argv)
            else:
                agent = subprocess.Popen(
                    self._agent_argv(worker, listener.fileno()),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    pass_fds=(listener.fileno(),),
                    env=self.launch_environ,
                )
        log.close()
        return agent, address

    def _fork_agents(self) -> bool:
        """Fork this job's agents (FORK_AGENTS_FROM), where forking is safe: no other thread runs here
        (a thread holding a lock at the fork would leave it held in the child forever)."""
        if len(self.plan.workers) < FORK_AGENTS_FROM or threading.active_count() > 1:
            return False
        from ...agent import cli  # noqa: F401  (imported once here: every child has it)

        return True

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        """A waiting spare (--spares), else a new agent, for each lost or rejected worker; whatever
        the old one left running goes first. A spare taken is asked for again at once."""
        by_name = {w.name: w for w in self.plan.workers}
        taken = {}
        for name in names:
            old = self.agents.get(name)
            if old is not None and old.poll() is None:
                kill_tree(old.pid)
                wait_killed(old, f"the agent of worker {name}")
            # daemons and ranks of the lost worker that outlived its agent: this job's only (another
            # local job of the same --name or --hostfile has workers of the same names)
            for pid in processes_with_env(env_names.WORKER, name, **{env_names.JOB: self.job_marker}):
                kill_tree(pid)
            spare = self.spares.take(name, why) if self.spares_waiting() else None
            if spare is None:
                self.spares.serving.pop(name, None)
                self._start_agent(by_name[name])
                continue
            phases.mark_worker(self.worker_times, name, "created")
            self.agents[name] = self.spare_agents.pop(spare)
            self.addresses[name] = self.spare_addresses.pop(spare)
            if spare in self.devices:
                self.devices[name] = self.devices.pop(spare)
            taken[name] = spare
            # another spare in its place; on one machine a GPU job has no GPU left for it (the
            # worker's own may be the one preflight rejected)
            if not self.spares.gpus:
                self._start_spare(self.spares.new_spare())
        return taken

    def wait_ready(self, deadline: float, progress) -> None:
        """Nothing to wait for: each agent's socket listened before the agent started.

        An agent that already exited (a broken interpreter, an unreadable
        secret) is reported here, with its own last line; one that dies later
        is a lost worker.
        """
        for name in self.agents:
            ended = self._agent_exit(name)
            if ended is not None:
                how, last_line = ended
                raise AllocationError(
                    f"worker {name} {how} before it was ready" + (f": {last_line}" if last_line else ""),
                    f"see {self.rundir / (name + '.agent.log')}",
                )
            phases.mark_worker(self.worker_times, name, "ready")
        progress(len(self.agents), len(self.plan.workers))

    def _agent_exit(self, name: str) -> tuple[str, str] | None:
        """How the worker's agent ended and its last log line; None while it runs."""
        code = self.agents[name].poll()
        if code is None:
            return None
        how = how_it_ended(code)
        log = self.rundir / f"{name}.agent.log"
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        return how, (lines[-1] if lines and code > 0 else "")

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        # every worker is on this machine: loopback, and a port free here (rank 0 binds all
        # addresses, so test the same; an ephemeral port was taken under load in CI)
        return "127.0.0.1", free_port_below_ephemeral()

    def exec_context(self) -> dict:
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": list(FORWARD_ENV),
            "cwd": os.getcwd(),
            "workers": served({name: {"address": addr} for name, addr in self.addresses.items()}, self.spares.serving),
        }

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        if settle:
            self._settle_silent_agents()
        lost = {}
        for name in self.agents:
            ended = self._agent_exit(name)
            if ended is not None:
                how, last_line = ended
                lost[name] = f"its agent {how}" + (f" ({last_line})" if last_line else "")
        return lost

    def _settle_silent_agents(self) -> None:
        """After a failed run, give an agent that no longer answers up to LOCAL_SETTLE_S to be reaped.

        A SIGKILLed agent's sockets close before the kernel lets its parent
        reap it (here its listener refused connections 0.3 ms before it was a
        zombie in one of three tries): the shim's "lost connection" can end
        mpirun, and mpilaunch ask, inside that moment, and the job then failed
        as an MPI error instead of being retried as a lost worker (CI, once).
        Only the agent's exit makes the worker lost, never the missing answer
        itself; a failed job pays one loopback ping per agent.
        """
        running = {name: self.addresses[name] for name, agent in self.agents.items() if agent.poll() is None}
        for name in silent_agents(running, self.secret_file) if running else ():
            try:
                wait_exit(self.agents[name], LOCAL_SETTLE_S)
            except subprocess.TimeoutExpired:
                pass

    def describe_workers(self) -> dict[str, dict]:
        out = {}
        for worker in self.plan.workers:
            proc = self.agents.get(worker.name)
            state = (
                "not started" if proc is None else ("running" if proc.poll() is None else f"exited {proc.returncode}")
            )
            out[worker.name] = {
                "host": "localhost",
                "address": self.addresses.get(worker.name),
                "pid": proc.pid if proc else None,
                "state": state,
                "gpus": self.devices.get(worker.name, []),
                **({"spare": self.spares.serving[worker.name]} if worker.name in self.spares.serving else {}),
            }
        return out

    def release(self) -> None:
        agents = [*self.agents.values(), *self.spare_agents.values()]
        for proc in agents:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in agents:
            try:
                wait_exit(proc, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                wait_killed(proc, "a worker's agent")
        # The agents end their sessions' descendants themselves; this sweep is
        # the backstop for anything that escaped them (all carry the marker).
        for pid in processes_with_env(env_names.JOB, self.job_marker):
            kill_tree(pid)
