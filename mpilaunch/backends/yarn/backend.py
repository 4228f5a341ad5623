"""YARN backend: one skein application whose worker containers host exec agents.

* ``allocate`` submits one application (``--name``) with one skein service,
  ``worker``, of N containers (``--memory``, ``--vcores``, ``yarn.io/gpu`` =
  GPUs per worker, ``--queue``, ``--node-label``). Each container runs
  ``mpilaunch.backends.yarn.in_cluster.container``, which starts ``mpilaunch agent``
  and publishes its address in skein's key-value store (``--env-archive``:
  from mpilaunch's pieces localized with the job, ``tools.py``).
* The job secret goes into that key-value store (mutual TLS with the
  ApplicationMaster, per-application credentials made here); containers read
  it with ``ApplicationClient.from_current()`` and hand it to the agent on
  stdin, never on a command line, in an environment or ``launch_container.sh``.
* ``wait_ready`` is all or nothing: every worker's agent must answer ``ping``
  before ``--start-timeout``, else the error carries what YARN says (state,
  diagnostics, pending container requests) and the application is killed.
* Where mpirun runs: with ``--launcher cluster`` (what ``auto`` means for
  yarn) in one more container, service ``launcher`` (part of the
  all-or-nothing wait), running :mod:`mpilaunch.backends.yarn.in_cluster.launcher`. Its launch
  description and the secret go through the key-value store; mpirun's
  output comes back in chunks through it and ``run_launcher`` feeds it to
  the mpirun workload's rank-output parser, so status lines, fail fast,
  ``--timeout`` and Ctrl-C behave as with ``--launcher local``. Either way
  mpirun reaches the containers through ``mpilaunch-rsh`` and the agents.
* ``job_finished`` ends the application with final status SUCCEEDED or FAILED
  (killed on allocation failure or interrupt) and, on failure, reports every
  worker container (host, state, exit status), tf-yarn style. Should this
  process die, the application's driver ends it (``orphan.py``).

skein is imported with this module (``backends.load`` hints the install).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import skein

from ...core import env_names, phases
from ...core.errors import AllocationError, UsageError
from ...core.pylauncher import PACKAGE_PARENT
from .. import rendezvous
from ..agent_workers import write_secret
from ..base import BaseBackend, Capabilities
from ..protocols import ClusterLauncher, JobsByName, ReplacesWorkers
from ..spare_pool import LauncherSwaps, SparePool, served
from . import follow, handoff, launch, manage, orphan, outcome, replace, report, tools
from . import spares as yarn_spares
from .client import TERMINAL_STATES, shorten, skein_client, state_name
from .keys import (
    FORWARD_ENV,
    FORWARD_ENV_WITH_ARCHIVE,
    KV_PREFIX,
    LAUNCHER_SERVICE,
    SERVICE,
    WORKER_KEY,
    WORKER_SECRET_KEY,
)
from .options import YarnOptions

LAUNCHER_MEMORY = "512 MiB"
ENV_DIR = tools.ENV_DIR  # where --env-archive is unpacked in each container
MASTER_MEMORY = "256 MiB"
POLL = 0.25


class YarnBackend(BaseBackend, ClusterLauncher, JobsByName, ReplacesWorkers):
    name = "yarn"
    options_class = YarnOptions
    capabilities = Capabilities(
        detach=True, replace_workers=True, spares=True, cluster_launcher=True, manage=True, render=True
    )
    named_job = manage.YarnNamedJob

    def __init__(self, spec, plan, rundir, *, cluster_launcher_allowed: bool = True):
        super().__init__(spec, plan, rundir, cluster_launcher_allowed=cluster_launcher_allowed)
        self.opts: YarnOptions = self.options
        # the workers get this PATH unless they run a packed environment of their own
        self.forwards_path = not self.opts.env_archive
        self.launcher_info: dict = {}
        self.launcher_container: dict = {}
        self.retired_launchers: set[str] = set()  # earlier attempts' launcher containers (--retries)
        self.attempt = 1
        self.silent: set[str] | None = None  # workers whose agent stopped answering (report.py)
        opts = self.opts
        if opts.env_archive and not os.path.isfile(opts.env_archive):
            raise UsageError(
                f"--env-archive {opts.env_archive} does not exist", "give a venv-pack or conda-pack archive (.tar.gz)"
            )
        if opts.vcores < 1:
            raise UsageError(f"--vcores must be at least 1, got {opts.vcores}", "e.g. --vcores 4")
        yarn_spares.check(spec, self.launcher)
        # --spares (yarn/spares.py): instances beyond the plan's, which serves which worker
        self.spares = SparePool.for_plan(plan)
        self.spare_names = [self.spares.new_spare().name for _ in range(spec.spares)]  # asked, in order
        self.first_spares = list(self.spare_names)  # the worker service's own instances N, N+1, ...
        self.spare_addresses: dict[str, str] = {}
        self.spare_info: dict[str, dict] = {}
        self.launcher_swaps = LauncherSwaps()  # the launcher container's own swaps (relaunched_in_launcher)
        self.slot_names = {w.name for w in plan.workers}
        self.secret_file = rundir / "secret"
        self.client = None
        self.app = None
        self.app_id: str | None = None
        self.security = None
        self.workers_info: dict[str, dict] = {}  # from the kv store
        self.addresses: dict[str, str] = {}
        self.ready_at: dict[str, float] = {}  # wall clock when its agent first answered
        self.containers: dict[str, dict] = {}  # worker name -> last known container facts
        self.replacements: dict[int, str] = {}  # container instance -> worker it replaced (replace.py)
        self.retired: set[int] = set()  # instances whose worker was replaced
        self.outcome: int | None = None
        self.failure: str | None = None
        self.released = False  # release() ran, or the job was handed off (handoff.py): nothing of it to end here
        self.heartbeat = None
        self._secret_put = False
        self.out_last = ""

    # ------------------------------------------------------------ spec

    @property
    def gpus_per_worker(self) -> int:
        return max(w.gpus for w in self.plan.workers)

    def service_script(self, module: str = "mpilaunch.backends.yarn.in_cluster.container") -> str:
        if self.opts.env_archive:  # the archive's python, mpilaunch's pieces localized (tools.py)
            return tools.service_script(module)
        return f"set -e\nexec {shlex.quote(sys.executable)} -m {module}\n"

    def service_env(self) -> dict[str, str]:
        env = {
            env_names.YARN_JOB: self.plan.job_name,
            # Container instance i is plan worker i (PS tasks are named by role).
            env_names.YARN_WORKER_NAMES: ",".join([w.name for w in self.plan.workers] + self.first_spares),
            env_names.YARN_GPUS: str(self.gpus_per_worker),
            env_names.YARN_KV: KV_PREFIX,
        }
        if not self.opts.env_archive:
            # The same mpilaunch as here, even when it is not installed but
            # imported from a checkout.
            paths = [PACKAGE_PARENT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def application_spec(self, security=None) -> "skein.ApplicationSpec":
        opts = self.opts
        try:
            resources = skein.Resources(memory=opts.memory, vcores=opts.vcores, gpus=self.gpus_per_worker)
        except (TypeError, ValueError) as e:
            raise UsageError(f"invalid YARN resources: {e}", "e.g. --memory '4 GiB' --vcores 4") from None
        files = tools.files(opts.env_archive, self.rundir) if opts.env_archive else {}
        service = skein.Service(
            instances=len(self.plan.workers) + self.spec.spares,
            resources=resources,
            script=self.service_script(),
            env=self.service_env(),
            files=files,
            node_label=opts.node_label or "",
            max_restarts=0,
            # The launcher decides the application's fate (and reports which
            # container ended); skein must not shut it down on its own.
            allow_failures=True,
        )
        services = {SERVICE: service}
        if self.launcher == "cluster":
            # Requested with the workers (its allocation overlaps theirs); it
            # waits for the launch description. A container added later with
            # add_container/scale was not reliably allocated by skein's AM.
            services[LAUNCHER_SERVICE] = skein.Service(
                instances=1,
                resources=skein.Resources(memory=LAUNCHER_MEMORY, vcores=1),
                script=self.service_script("mpilaunch.backends.yarn.in_cluster.launcher"),
                env=self.service_env(),
                files=files,
                max_restarts=0,
                allow_failures=True,
            )
        master = orphan.master(self, skein.Resources(memory=MASTER_MEMORY, vcores=1), security, files)
        return skein.ApplicationSpec(
            name=self.plan.job_name,
            queue=opts.queue or "default",
            tags={"mpilaunch"},
            max_attempts=1,
            master=master,
            services=services,
        )

    def render(self) -> str:
        return self.application_spec().to_yaml()

    # ------------------------------------------------------------ lifecycle

    def allocate(self) -> None:
        write_secret(self.secret_file)
        if self.opts.env_archive:
            tools.build(self.rundir)
        self.client = skein_client(log=str(self.rundir / "skein-driver.log"))
        self.security = skein.Security.new_credentials()
        try:
            self.app_id = self.client.submit(self.application_spec(self.security))
            for w in self.plan.workers:  # asked of YARN: each container is requested with the application
                phases.mark_worker(self.worker_times, w.name, "created")
        except skein.exceptions.SkeinError as e:
            raise AllocationError(
                f"YARN refused the application: {shorten(str(e))}",
                "check --queue, --node-label, --memory, --vcores and --gpus-per-node against the cluster",
            ) from None

    def app_report(self):
        return self.client.application_report(self.app_id)

    def _raise_if_ended(self, app_report=None) -> None:
        """Allocation failed when the application ended before its workers were ready."""
        app_report = app_report or self.app_report()
        state = state_name(app_report.state)
        if state not in TERMINAL_STATES:
            return
        # --env-archive: its python could not run the ApplicationMaster's driver?
        problem = self.opts.env_archive and tools.driver_problem(self.client, app_report)
        if problem:
            raise AllocationError(problem, tools.HINT)
        raise AllocationError(
            f"YARN application {self.app_id} ended ({state}) before its workers were ready: "
            f"{shorten(app_report.diagnostics) or 'no diagnostics'}",
            "check the queue, node label and resources; `yarn logs` has the ApplicationMaster's log",
        )

    def _connect(self) -> bool:
        """Connect to the ApplicationMaster once it runs and hand it the secret."""
        app_report = self.app_report()
        self._raise_if_ended(app_report)
        if state_name(app_report.state) != "RUNNING":
            return False
        self.app = self.client.connect(self.app_id, wait=False, security=self.security)
        if not self.spec.detach:  # a detached job's launcher ends it; nobody stays to renew
            self.heartbeat = orphan.start_heartbeat(self.app.kv, KV_PREFIX, self.spec.orphan_timeout)
        from ...rsh_agent.agent_client import read_secret

        self.app.kv[KV_PREFIX + WORKER_SECRET_KEY] = read_secret(str(self.secret_file))
        self._secret_put = True
        return True

    def refresh_containers(self) -> list | None:
        """The worker containers as the ApplicationMaster sees them (None: it cannot be asked)."""
        if self.app is None:
            return None
        try:
            containers = self.app.get_containers(services=[SERVICE], states=list(skein.model.ContainerState))
        except Exception:
            return None
        for c in containers:
            name = self.worker_of(c)
            if name is None:
                continue
            self.containers[name] = {
                "id": c.id,
                "instance": c.instance,
                "container": c.yarn_container_id or None,
                "node": c.yarn_node_http_address or None,
                "state": state_name(c.state),
                "exit": shorten(c.exit_message, 300) or None,
            }
            if self.containers[name]["state"] == "RUNNING" and name in self.slot_names:  # a second late at most
                phases.mark_worker(self.worker_times, name, "running")
        return containers

    def worker_of(self, container) -> str | None:
        """The worker a container serves: instance i is plan worker i; replacements as recorded; retired: None."""
        if container.instance in self.retired:
            return None
        if container.instance in self.replacements:
            return self.replacements[container.instance]
        names = [w.name for w in self.plan.workers] + self.first_spares
        return names[container.instance] if container.instance < len(names) else None

    def wait_ready(self, deadline: float, progress) -> None:
        from ...rsh_agent.agent_client import ping, read_secret

        secret = read_secret(str(self.secret_file))
        total = len(self.plan.workers)
        next_check = 0.0
        while True:
            try:
                if self.app is None:
                    self._connect()
                for key, value in (self.app.kv.get_prefix(KV_PREFIX + WORKER_KEY) if self.app else {}).items():
                    name = key[len(KV_PREFIX + WORKER_KEY) :]
                    if name in self.addresses or name in self.spare_addresses:
                        continue
                    info = json.loads(value)
                    if name not in self.slot_names:  # a spare (--spares): it waits, the job does not
                        if name in self.spare_names:
                            yarn_spares.register(self, name, info, ping(info["address"], secret, timeout=2.0))
                        continue
                    self.workers_info[name] = info
                    if ping(info["address"], secret, timeout=2.0):
                        self.addresses[name] = info["address"]
                        self.ready_at[name] = round(time.time(), 3)
                        phases.mark_worker(self.worker_times, name, "ready")
            except (skein.exceptions.SkeinError, ConnectionError, OSError):
                # the ApplicationMaster is gone (its driver failed, or it was killed): the RM says so soon
                for _ in range(20):
                    self._raise_if_ended()
                    time.sleep(POLL)
                raise
            if self.app is not None:
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + 1.0
                    self._raise_if_a_container_ended()
            progress(len(self.addresses), total)
            if len(self.addresses) == total and self._launcher_running():
                self.refresh_containers()
                # Every agent holds it now; the key-value store need not (unless a spare has yet to read it).
                if not yarn_spares.pending(self):
                    self.app.kv.discard(KV_PREFIX + WORKER_SECRET_KEY)
                return
            if time.monotonic() > deadline:
                raise AllocationError(self._not_ready_message(total), self._not_ready_hint())
            time.sleep(POLL)

    def _launcher_running(self) -> bool:
        return self.launcher != "cluster" or self.refresh_launcher() == "RUNNING"

    def _raise_if_a_container_ended(self) -> None:
        if self.launcher == "cluster" and self.refresh_launcher() in ("FAILED", "KILLED", "SUCCEEDED"):
            c = self.launcher_container
            self._raise_archive_problem(c.get("node"), c.get("container"), LAUNCHER_SERVICE)
            raise AllocationError(
                f"the launcher container ({c.get('container')} on {c.get('node')}) ended ({c.get('state')}) "
                f"before the job started: {shorten(c.get('exit')) or 'no exit message'}",
                "see the container's log (mpilaunch logs NAME --backend yarn), or use --launcher local",
            )
        for c in self.refresh_containers() or []:
            state = state_name(c.state)
            name = self.worker_of(c)
            if state in ("FAILED", "KILLED", "SUCCEEDED") and name in self.slot_names:  # a spare's end: not the job's
                self._raise_archive_problem(c.yarn_node_http_address, c.yarn_container_id, SERVICE)
                raise AllocationError(
                    f"worker {name} (YARN container {c.yarn_container_id} on {c.yarn_node_http_address}) "
                    f"ended ({state}) before it was ready: {shorten(c.exit_message) or 'no exit message'}",
                    "see the container's stderr (mpilaunch logs NAME --backend yarn)",
                )

    def _raise_archive_problem(self, node: str | None, container: str | None, service: str) -> None:
        """An ended container's finding that the --env-archive cannot run mpilaunch's pieces, if any."""
        problem = self.opts.env_archive and tools.container_problem(node, container, service)
        if problem:
            raise AllocationError(problem, tools.HINT)

    def _not_ready_message(self, total: int) -> str:
        missing = sorted(w.name for w in self.plan.workers if w.name not in self.addresses)
        if missing:
            parts = [
                f"{len(missing)} of {total} workers not ready before --start-timeout "
                f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})"
            ]
        else:
            parts = [f"all {total} workers ready but the launcher container not running before --start-timeout"]
        try:
            app_report = self.app_report()
            parts.append(
                f"YARN application {self.app_id} is {state_name(app_report.state)} in queue {app_report.queue}"
                + (f": {shorten(app_report.diagnostics)}" if app_report.diagnostics else "")
            )
        except Exception as e:
            parts.append(f"YARN application {self.app_id}: no report ({shorten(str(e), 120)})")
        if self.app is not None:
            containers = self.refresh_containers() or []
            pending = [c for c in containers if state_name(c.state) in ("WAITING", "REQUESTED")]
            running = [c for c in containers if state_name(c.state) == "RUNNING"]
            opts = self.opts
            want = f"memory={opts.memory}, vcores={opts.vcores}, yarn.io/gpu={self.gpus_per_worker}"
            if opts.node_label:
                want += f", node label {opts.node_label}"
            parts.append(f"{len(pending)} container requests pending ({want}), {len(running)} running")
            if self.launcher == "cluster" and self.refresh_launcher() != "RUNNING":
                parts.append(
                    f"launcher container {self.launcher_container.get('state', 'not requested').lower()} "
                    f"(memory={LAUNCHER_MEMORY}, vcores=1)"
                )
        else:
            parts.append("the ApplicationMaster never started")
        return "; ".join(parts)

    def _not_ready_hint(self) -> str:
        return (
            "the cluster may lack free resources in this queue/partition: lower --gpus, --memory or "
            "--vcores, pick another --queue/--node-label, or raise --start-timeout"
        )

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        return rendezvous.free_port_through_agent(
            self.addresses[worker], str(self.secret_file), rendezvous.rank_python(self.rank_prefix())
        )

    def exec_context(self) -> dict:
        forward = FORWARD_ENV_WITH_ARCHIVE if self.opts.env_archive else FORWARD_ENV
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": list(forward),
            # Daemons start in their container's directory (this machine's
            # cwd need not exist on the NodeManagers).
            "cwd": None,
            "workers": served({name: {"address": addr} for name, addr in self.addresses.items()}, self.spares.serving),
        }

    def rank_prefix(self) -> list[str]:
        if self.opts.env_archive:
            # The archive's python, whose absolute path only the container knows; the tools' wrapper.
            return tools.rank_prefix()
        return [sys.executable, "-m", "mpilaunch.rank"]

    # ------------------------------------------------------------ cluster launcher

    def put_launch(self) -> None:
        launch.put_launch(self)

    @classmethod
    def remote_mpi_info(cls, spec):
        """None: the launcher container runs the MPI of this machine's job (its mpirun is found here)."""
        return None

    def relaunch(self, attempt: int) -> None:
        launch.relaunch(self, attempt)

    def launcher_takes_lost_workers(self) -> bool:
        """--retries with --spares and the launcher container: it swaps a spare in itself (yarn/spares.py)."""
        return self.launcher_in_cluster and bool(self.spec.spares) and bool(self.spec.retries)

    def launcher_swapped(self, output, text: str) -> None:
        """A swap the launcher container made (``follow.drain_output``): kept here, as k8s does."""
        self.launcher_swaps.take(text, self.status_token, output, lambda s: yarn_spares.taken_by_launcher(self, s))

    def relaunched_in_launcher(self) -> list[dict]:
        return self.launcher_swaps.drain()

    def run_launcher(self, output, deadline: float | None) -> int | None:
        """Start the launcher container, feed its mpirun output to ``output``, return mpirun's code
        (:func:`.follow.run_launcher`)."""
        return follow.run_launcher(self, output, deadline)

    def refresh_launcher(self) -> str | None:
        try:
            containers = self.app.get_containers(services=[LAUNCHER_SERVICE], states=list(skein.model.ContainerState))
        except Exception:
            return None
        for c in containers:
            if c.id in self.retired_launchers:
                continue  # an earlier attempt's (launch.relaunch)
            self.launcher_container.update(
                {
                    "id": c.id,
                    "container": c.yarn_container_id or None,
                    "node": c.yarn_node_http_address or None,
                    "state": state_name(c.state),
                    "exit": shorten(c.exit_message, 300) or None,
                }
            )
            return state_name(c.state)
        return None

    def describe_workers(self) -> dict[str, dict]:
        out = {}
        for w in self.plan.workers:
            info = self.workers_info.get(w.name, {})
            facts = self.containers.get(w.name, {})
            out[w.name] = {
                "application": self.app_id,
                "container": facts.get("container") or info.get("container"),
                "host": facts.get("node") or info.get("host"),
                "address": self.addresses.get(w.name),
                "ready_at": self.ready_at.get(w.name),
                "state": facts.get("state", "not started"),
                "exit": facts.get("exit"),
                "gpus": info.get("gpus", []),
                "gpu_source": info.get("gpu_source"),
                **({"spare": self.spares.serving[w.name]} if w.name in self.spares.serving else {}),
            }
        return out

    # ------------------------------------------------------------ end

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        return report.lost_workers(self, settle)

    def hand_off(self, deadline: float, progress) -> None:
        handoff.hand_off(self, deadline, progress)

    def manage_flags(self) -> str:
        return "--backend yarn"  # an application is found by its name alone

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        if not self.spec.spares:
            replace.replace_workers(self, names)
            return {}
        return yarn_spares.swap(self, names, why, lambda rest: replace.replace_workers(self, rest))

    def spares_waiting(self) -> int:
        return yarn_spares.waiting(self)

    def job_finished(self, exit_code: int, failure: str | None) -> str | None:
        self.outcome, self.failure = exit_code, failure
        if exit_code == 0 or self.app is None:
            return None
        try:
            return report.failure_report(self)
        except Exception:
            return None

    def release(self) -> None:
        if self.released or (self.client is None and self.app is None):
            return  # released already, or nothing allocated yet (a later allocate is released by a later call)
        self.released = True
        try:
            if self.app_id is not None and self.client is not None:
                self._finish_application()
        except Exception:
            pass
        finally:
            if self.heartbeat is not None:  # only now: the driver must not end the application first
                self.heartbeat.stop()
            for obj in (self.app, self.client):
                try:
                    if obj is not None:
                        obj.close()
                except Exception:
                    pass

    def _finish_application(self) -> None:
        ended_ok = self.outcome == 0
        graceful = self.app is not None and self.outcome not in (None, 3, 130)
        try:
            if graceful:
                status = "SUCCEEDED" if ended_ok else "FAILED"
                # the same form as a detached job's, so `mpilaunch wait` reads either
                self.app.shutdown(status, diagnostics=outcome.diagnostics(self.outcome, self.failure, None, None))
            else:
                self.client.kill_application(self.app_id)
        except Exception:
            self.client.kill_application(self.app_id)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if state_name(self.app_report().state) in TERMINAL_STATES:
                    return
            except Exception:
                pass
            time.sleep(POLL)
        self.client.kill_application(self.app_id)
