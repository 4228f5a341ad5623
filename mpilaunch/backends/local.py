"""Local backend: one exec agent process per worker on this machine.

Each worker is a real ``mpilaunch agent`` listening on loopback; mpirun
reaches it through ``mpilaunch-rsh`` exactly as it reaches a YARN
container, so the local backend exercises the whole exec path. Worker host
names (``<job>-worker-<i>``) do not resolve, which is what makes mpirun hand
them to the agent instead of forking locally.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

from .. import gpu_slots
from ..errors import AllocationError, UsageError
from ..procs import kill_tree, processes_with_env
from ..pylauncher import write_launcher
from .base import BaseBackend

# What the daemons need from the launcher's environment to find the same MPI
# and Python; on the local backend launcher and workers share one machine.
FORWARD_ENV = (
    "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "OPAL_PREFIX",
    "PRTE_PREFIX", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
)


def write_secret(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


# An agent is ready ~30 ms after its start; a finer poll than that is a
# few stat() calls, and each tick of a coarser one adds to every launch.
READY_POLL_S = 0.01


class Backend(BaseBackend):
    name = "local"

    def __init__(self, spec, plan, rundir):
        if spec.launcher == "cluster":
            raise UsageError(
                "--launcher cluster needs a cluster backend; local workers have no cluster to run mpirun in",
                "drop --launcher (mpirun runs on this machine) or use --backend k8s or yarn",
            )
        super().__init__(spec, plan, rundir)
        self.secret_file = rundir / "secret"
        self.agents: dict[str, subprocess.Popen] = {}
        self.addresses: dict[str, str] = {}
        self.devices: dict[str, list[str]] = {}
        self.job_marker = f"{plan.job_name}-{os.getpid()}-{secrets.token_hex(4)}"

    @classmethod
    def discover_gpus_per_node(cls, spec) -> int | None:
        return len(gpu_slots.discover_local_gpus()) or None

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

    def _agent_argv(self, worker) -> list[str]:
        argv = [
            # named like the module: `ps` shows "mpilaunch.agent" as for `python -m mpilaunch.agent`
            self._launcher("mpilaunch.agent", "mpilaunch.agent.cli"),
            "--name", worker.name,
            "--listen", "127.0.0.1:0",
            "--address-file", str(self.rundir / f"{worker.name}.addr"),
            "--secret-file", str(self.secret_file),
            "--exit-with-pid", str(os.getpid()),
            "--env", f"MPILAUNCH_JOB={self.job_marker}",
        ]
        if worker.name in self.devices:
            argv += ["--env", "CUDA_VISIBLE_DEVICES=" + ",".join(self.devices[worker.name])]
        return argv

    def allocate(self) -> None:
        if self.plan.gpus:
            self.devices = gpu_slots.partition_devices(gpu_slots.discover_local_gpus(), self.plan)
        write_secret(self.secret_file)
        for worker in self.plan.workers:
            self._start_agent(worker)

    def _start_agent(self, worker) -> None:
        log = open(self.rundir / f"{worker.name}.agent.log", "ab")
        # Own session: a Ctrl-C at the terminal reaches mpilaunch only,
        # which then tears the workers down in order.
        self.agents[worker.name] = subprocess.Popen(
            self._agent_argv(worker), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )
        log.close()

    def replace_workers(self, names: list[str]) -> None:
        """A new agent for each lost worker; whatever the old one left running goes first."""
        by_name = {w.name: w for w in self.plan.workers}
        for name in names:
            old = self.agents.get(name)
            if old is not None and old.poll() is None:
                kill_tree(old.pid)
                old.wait()
            # daemons and ranks of the lost worker that outlived its agent
            for pid in processes_with_env("MPILAUNCH_WORKER", name):
                kill_tree(pid)
            self.addresses.pop(name, None)
            (self.rundir / f"{name}.addr").unlink(missing_ok=True)
            self._start_agent(by_name[name])

    def wait_ready(self, deadline: float, progress) -> None:
        from ..rsh_agent.agent_client import ping, read_secret

        secret = read_secret(str(self.secret_file))
        total = len(self.plan.workers)
        while True:
            for name, proc in self.agents.items():
                if name in self.addresses:
                    continue
                if proc.poll() is not None:
                    log = (self.rundir / f"{name}.agent.log").read_text(errors="replace").strip()
                    tail = log.splitlines()[-1] if log else "no output"
                    raise AllocationError(
                        f"worker {name} exited with code {proc.returncode} before it was ready: {tail}",
                        f"see {self.rundir / (name + '.agent.log')}",
                    )
                addr_file = self.rundir / f"{name}.addr"
                if addr_file.exists():
                    address = addr_file.read_text().strip()
                    if address and ping(address, secret, timeout=2.0):
                        self.addresses[name] = address
            progress(len(self.addresses), total)
            if len(self.addresses) == total:
                return
            if time.monotonic() > deadline:
                missing = sorted(set(self.agents) - set(self.addresses))
                raise AllocationError(
                    f"{len(missing)} of {total} workers not ready before --start-timeout: {', '.join(missing[:5])}",
                    "raise --start-timeout, or check the machine's load",
                )
            time.sleep(READY_POLL_S)

    def exec_context(self) -> dict:
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": list(FORWARD_ENV),
            "cwd": os.getcwd(),
            "workers": {name: {"address": addr} for name, addr in self.addresses.items()},
        }

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        lost = {}
        for name, proc in self.agents.items():
            code = proc.poll()
            if code is not None:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                lost[name] = f"its agent was {how}"
        return lost

    def describe_workers(self) -> dict[str, dict]:
        out = {}
        for worker in self.plan.workers:
            proc = self.agents.get(worker.name)
            state = "not started" if proc is None else ("running" if proc.poll() is None else f"exited {proc.returncode}")
            out[worker.name] = {
                "host": "localhost",
                "address": self.addresses.get(worker.name),
                "pid": proc.pid if proc else None,
                "state": state,
                "gpus": self.devices.get(worker.name, []),
            }
        return out

    def release(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.agents.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                proc.wait()
        # The agents end their sessions' descendants themselves; this sweep is
        # the backstop for anything that escaped them (all carry the marker).
        for pid in processes_with_env("MPILAUNCH_JOB", self.job_marker):
            kill_tree(pid)
