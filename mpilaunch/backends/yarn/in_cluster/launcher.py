"""The launcher container of a YARN job: ``python -m mpilaunch.backends.yarn.in_cluster.launcher``.

With ``--launcher cluster`` (what ``auto`` means for yarn) the application
has one container of the skein service ``launcher``, requested with the
workers. This module runs in it and

1. waits for and reads the launch description (put once every worker's
   agent answers) (``<kv>launcher/spec``: workers with their
   agent addresses, the rank command, resolved ``-x`` values, mpirun, ...)
   and the job secret (``<kv>launcher/secret``, deleted once read) from
   skein's key-value store: the secret is written to a 0600 file in a
   private directory and is on no command line, in no environment and in no
   ``launch_container.sh``;
2. writes the hostfile, the shim's context file and the shim launcher for
   its own paths, publishes ``<kv>launcher/info`` (its ``CONTAINER_ID``,
   host, mpirun) and runs mpirun with ``mpilaunch-rsh`` and the agents
   through the one in-cluster runner (:mod:`mpilaunch.job.in_cluster`: the same
   lifecycle and mpirun workload as the local launcher;
   :class:`PublishedContainers` is its backend);
3. streams mpirun's stdout/stderr lines into the key-value store in chunks
   (``<kv>launcher/out/<seq>``, JSON ``[[stream, line], ...]``) that the
   submitting side feeds to its rank-output parser and deletes, stops mpirun
   when ``<kv>launcher/stop`` appears (fail fast after a rank failed), and
   finally puts the job's exit code in ``<kv>launcher/exit``.
4. answers ``mpilaunch stacks NAME`` (``<kv>launcher/stacks/request/<id>``)
   with every rank's stacks, taken through its own agents' channel
   (``stacks_kv.py``): the secret stays in this container.

A detached job's launcher (``"detach": true`` in the launch description)
writes mpirun's output to its own container log instead, enforces
``--timeout`` itself and ends the application (``detached.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from ....core import env_names, mpi
from ....core.errors import AllocationError, MpilaunchError
from ....core.exit_codes import EXIT_FAILED, EXIT_USAGE
from ....core.launcher_lines import error_line, swap_line_after
from ....core.spec import JobSpec, Plan
from ....job.in_cluster import run_launch
from ....job.lifecycle import make_rundir
from ....runtime.procs import terminate_group
from ... import rendezvous
from ...base import BaseBackend, Capabilities
from ...launch_description import LaunchDescription
from ...protocols import ReplacesWorkers
from ...spare_pool import served
from .. import stacks_kv
from ..keys import EXIT_KEY, INFO_KEY, KV_PREFIX, LAUNCHER_SECRET_KEY, OUT_KEY, SPEC_KEY, STOP_KEY
from ..kv_poll import wait_key
from . import spare_swaps
from .detached import WorkerContainers, finish, to_container_log

FLUSH_S = 0.1
CHUNK_BYTES = 256 * 1024


class Streamer:
    """Lines of mpirun's pipes -> numbered chunks in the key-value store."""

    def __init__(self, kv, prefix: str):
        self.kv = kv
        self.prefix = prefix
        self.pending: list[list[str]] = []
        self.size = 0
        self.seq = 0
        self.lock = threading.Lock()
        self.put_lock = threading.Lock()
        self.done = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self.flusher.start()

    def add(self, stream: str, line: str) -> None:
        with self.lock:
            self.pending.append([stream, line])
            self.size += len(line)
            big = self.size >= CHUNK_BYTES
        if big:
            try:
                self.flush()
            except Exception:
                pass  # the lines are kept: the flusher tries again at its next tick, and says so

    def flush(self) -> None:
        """Put what is pending as the next chunk. A put that fails (the application master did not
        answer) loses nothing: the lines go back in front of the pending ones, and the chunk's
        number is used by the next put that succeeds, so the submitting side sees every line once,
        in order. The failure is raised to the caller."""
        with self.put_lock:
            with self.lock:
                batch, self.pending, self.size = self.pending, [], 0
            if not batch:
                return
            key = f"{self.prefix}{OUT_KEY}{self.seq:010d}"
            try:
                self.kv[key] = json.dumps(batch).encode()
            except BaseException:
                with self.lock:
                    self.pending[:0] = batch
                    self.size += sum(len(line) for _, line in batch)
                raise
            self.seq += 1

    def _flush_loop(self) -> None:
        failing = False
        while not self.done.wait(FLUSH_S):
            try:
                self.flush()
            except Exception as e:  # tried again at the next tick; said once per run of failures
                if not failing:
                    log(f"mpirun's output could not be put into the key-value store ({e!r}); trying again")
                failing = True
            else:
                if failing:
                    log("mpirun's output is put into the key-value store again")
                failing = False

    def pump(self, stream: str, pipe) -> threading.Thread:
        def run():
            for raw in iter(pipe.readline, b""):
                self.add(stream, raw.decode("utf-8", "replace"))
            pipe.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self, tries: int = 5, pause_s: float = 0.5) -> None:
        """The last lines, before the exit code is put: tried ``tries`` times."""
        self.done.set()
        for attempt in range(1, tries + 1):
            try:
                self.flush()
                return
            except Exception as e:
                last = attempt == tries
                log(
                    f"mpirun's last output could not be put into the key-value store ({e!r}); "
                    + ("it is lost" if last else "trying again")
                )
                if not last:
                    time.sleep(pause_s)


def log(message: str) -> None:
    """A line of this container's own log (``launcher.log``): what it did, for a job that stalls."""
    print(f"{time.strftime('%H:%M:%S')} mpilaunch-yarn-launcher: {message}", file=sys.stderr, flush=True)


class PublishedContainers(BaseBackend, ReplacesWorkers):
    """The job's worker containers, seen from the launcher container: their agents answer already.

    With ``--retries`` and ``--spares`` (``launch.relaunches``, ``cluster["spares"]``) a worker
    whose agent is gone is swapped for a spare container whose agent answers, and mpirun runs
    again from this container (``spare_swaps.py``); the submitting side, told by a signed line
    relayed with mpirun's output (``swapped``), retires the lost container and asks for a new spare."""

    name = "yarn"
    capabilities = Capabilities(replace_workers=True, spares=True)

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan,
        rundir: Path,
        launch: LaunchDescription,
        secret_file: Path,
        watch: WorkerContainers | None = None,
        kv=None,
        relay=None,
        kv_prefix: str = KV_PREFIX,
    ):
        super().__init__(spec, plan, rundir)
        self.launch = launch
        self.secret_file = secret_file
        self.watch = watch  # detached only: nobody on the submitting side watches the containers
        # the workers got the submitting side's PATH where it forwards it (no --env-archive)
        self.forwards_path = "PATH" in (launch.cluster.get("forward_env") or ())
        # --spares: which spare container serves which worker, and each worker's agent address now
        self.serving: dict[str, str] = dict(launch.cluster.get("serving") or {})
        self.addresses: dict[str, str] = dict(launch.addresses())
        # where the spares register (the application's key-value store) when this container swaps them in
        self.kv = kv if launch.cluster.get("spares") else None
        self.kv_prefix, self.relay = kv_prefix, relay

    def _waiting_spares(self) -> list[tuple[str, str]]:
        from ....rsh_agent.agent_client import read_secret

        if self.kv is None:
            return []
        secret = read_secret(str(self.secret_file))
        try:
            return spare_swaps.waiting_spares(
                self.kv, self.kv_prefix, self.launch.job, set(self.serving.values()), secret
            )
        except Exception:  # the key-value store did not answer: no spare now
            return []

    def spares_waiting(self) -> int:
        return len(self._waiting_spares())

    def worker_changes(self):
        """Set when a shim's agent session ends (``runtime/exit_notes.py``): a gone agent is looked
        for at once, not at the watch's next look."""
        from ....runtime.exit_notes import noted_exits

        return noted_exits(self.rundir) if self.kv is not None else contextlib.nullcontext()

    def can_replace(self, names: list[str]) -> bool:
        """Only a spare whose agent answers: this container may ask YARN for no container."""
        return self.spares_waiting() >= len(names)

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        waiting = self._waiting_spares()
        if len(waiting) < len(names):
            raise AllocationError(
                f"{len(names)} worker{'s' if len(names) > 1 else ''} to replace and {len(waiting)} spare "
                f"container{'s' if len(waiting) != 1 else ''} answering",
                "run again; add --spares for more room",
            )
        taken = {}
        for name in names:
            spare, self.addresses[name] = waiting.pop(0)
            taken[name] = self.serving[name] = spare
        return taken

    def swapped(self, taken: dict[str, str], why: str, ended) -> None:
        """The submitting side's word, with mpirun's output (a signed line it does not show)."""
        if self.relay is not None:
            self.relay("stderr", swap_line_after(taken, why, ended, self.launch.status_token) + "\n")

    def allocate(self) -> None:
        pass  # the submitting side requested the containers

    def wait_ready(self, deadline: float, progress) -> None:
        pass  # the launch description is put only once every worker's agent answered

    def exec_context(self) -> dict:
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": list(self.launch.cluster.get("forward_env") or ()),
            "cwd": None,
            # --spares: which spare serves which worker
            "workers": served({name: {"address": a} for name, a in self.addresses.items()}, self.serving),
        }

    def rank_prefix(self) -> list[str]:
        return list(self.launch.rank_prefix)

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        address = self.addresses[worker]
        return rendezvous.free_port_through_agent(
            address, str(self.secret_file), rendezvous.rank_python(self.rank_prefix())
        )

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        if self.watch is not None:
            return self.watch.lost(settle)
        # attached, the submitting side watches; where this container swaps spares in, it looks too
        return spare_swaps.gone_workers(self.addresses) if self.kv is not None else {}

    def describe_workers(self) -> dict[str, dict]:
        if self.watch is None:
            return super().describe_workers()
        self.watch.refresh()
        # the submitting side's keys (yarn.Backend.describe_workers): the same "container C on HOST" in reports
        return {
            w.name: {
                "container": f.get("container"),
                "host": f.get("node"),
                "state": f.get("state"),
                "exit": f.get("exit"),
            }
            for w in self.plan.workers
            for f in [self.watch.facts.get(w.name, {})]
        }

    def release(self) -> None:
        pass  # the submitting side ends the application


def write_secret_file(rundir: Path, secret: bytes) -> Path:
    secret_file = rundir / "secret"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret.rstrip(b"\n") + b"\n")
    return secret_file


def run(app, prefix: str, launch: LaunchDescription) -> tuple[int, str | None, dict | None]:
    """Run mpirun as the launch description says; (exit code, failure line, the job's report or None)."""
    secret = wait_key(app.kv, prefix + LAUNCHER_SECRET_KEY)
    app.kv.discard(prefix + LAUNCHER_SECRET_KEY)
    detached = launch.detach
    # attached: chunks in the kv store for the submitting side; detached: this container's log
    streamer = None if detached else Streamer(app.kv, prefix)
    relay = to_container_log if detached else streamer.add
    # what the launcher did, in its container's log; a detached job's log is mpirun's output alone
    note = (lambda message: None) if detached else log
    rundir = make_rundir(launch.job + "-launcher")
    try:
        secret_file = write_secret_file(rundir, secret)
        del secret
        # What the submitting machine's mpirun would have had (its PATH etc.,
        # forwarded by the shim to the daemons); none with --env-archive.
        os.environ.update(launch.cluster.get("environ") or {})
        try:
            info = mpi.find_mpirun(launch.mpi, launch.mpirun, os.environ.get("PATH"))
        except Exception as e:
            failure = f"launcher: no usable mpirun in the launcher container: {e}"
            relay("stderr", f"mpilaunch: {failure}\n")
            return EXIT_USAGE, failure, None

        def containers(spec, plan):
            watch = WorkerContainers(app, plan, launch.addresses(), secret_file) if detached else None
            # `mpilaunch stacks NAME --backend yarn` from wherever its owner is: this container takes the stacks
            take = stacks_kv.stacks_taker(rundir / "context.json", dict(enumerate(plan.rank_to_worker())))
            threading.Thread(
                target=stacks_kv.serve, args=(app.kv, prefix, take, note), daemon=True, name="stacks-requests"
            ).start()
            return PublishedContainers(spec, plan, rundir, launch, secret_file, watch, app.kv, relay, prefix)

        def on_started(workload) -> None:
            workload.on_started = lambda proc: started(app, prefix, info, proc, note)

        result, _ = run_launch(launch, info, rundir, containers, relay, on_started)
        note(f"the job ended: exit {result.exit_code}")
        return result.exit_code, result.failure, result.report
    finally:
        try:
            if streamer is not None:
                streamer.close()
        except Exception:
            pass
        shutil.rmtree(rundir, ignore_errors=True)


def started(app, prefix: str, info: mpi.MpiInfo, proc, note=log) -> None:
    """mpirun runs: publish where (for reports), and stop it when the submitting side asks."""
    note(f"mpirun started (pid {proc.pid}, {info.flavour} {info.version})")
    app.kv[prefix + INFO_KEY] = json.dumps(
        {
            "container": os.environ.get("CONTAINER_ID"),
            "host": os.environ.get("NM_HOST"),
            "mpirun": info.path,
            "flavour": info.flavour,
            "version": info.version,
            "pid": proc.pid,
        }
    ).encode()

    def watch_stop():
        try:
            wait_key(app.kv, prefix + STOP_KEY)
        except Exception:
            return
        terminate_group(proc)  # through the Popen: the workload's wait reads mpirun's real status

    threading.Thread(target=watch_stop, daemon=True).start()


def main() -> int:
    import skein

    prefix = os.environ.get(env_names.YARN_KV, "mpilaunch/")
    app = skein.ApplicationClient.from_current()
    detached = False
    report = None
    launch = None
    try:
        launch = LaunchDescription.from_dict(json.loads(wait_key(app.kv, prefix + SPEC_KEY).decode()))
        detached = launch.detach
        code, failure, report = run(app, prefix, launch)
    except MpilaunchError as e:  # found here before mpirun (a program the workers lack): the user's error
        print(e.format(), file=sys.stderr, flush=True)
        code, failure = e.exit_code, e.message
        if not detached:  # one signed line the submitting side raises again (core/launcher_lines.py)
            carried = error_line(e, launch.status_token if launch else None)
            app.kv[prefix + OUT_KEY + "9999999999"] = json.dumps([["stderr", carried + "\n"]]).encode()
    except Exception as e:
        print(f"mpilaunch-yarn-launcher: error: {e!r}", file=sys.stderr, flush=True)
        code, failure = EXIT_FAILED, f"launcher container failed: {e!r}"
        if not detached:
            try:
                app.kv[prefix + OUT_KEY + "9999999999"] = json.dumps([["stderr", f"mpilaunch: {failure}\n"]]).encode()
            except Exception:
                pass
    if detached:  # every exit path: nobody else will end a detached job's application
        finish(app, code, failure, report)
    else:
        app.kv[prefix + EXIT_KEY] = str(code).encode()
    return code


if __name__ == "__main__":
    try:
        code = main()
    except Exception as e:
        print(f"mpilaunch-yarn-launcher: error: {e!r}", file=sys.stderr, flush=True)
        code = EXIT_FAILED
    sys.stderr.flush()
    os._exit(code)
