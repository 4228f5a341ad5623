"""Entry point of the launcher pod: ``python3 -m mpilaunch.backends.k8s.in_cluster.launcher LAUNCH_JSON``.

Runs inside the cluster with the job's ServiceAccount (in-cluster
credentials: ``KUBERNETES_SERVICE_HOST/PORT`` and the token and CA under
``$MPILAUNCH_K8S_SA_DIR``, default
``/var/run/secrets/kubernetes.io/serviceaccount``; the token file is re-read
by every shim, so rotated tokens keep working). It

1. waits until every worker pod is Ready (``get`` on each pod by name, which
   is all the Role allows) — the launcher never races the workers;
2. finds the image's mpirun and renders the hostfile for its flavour;
3. runs mpirun with ``mpilaunch-rsh`` as the rsh agent, exec transport,
   and exits with the job's status. mpirun's tagged output goes to the pod log
   unchanged; the CLI that follows the log reads rank status lines from it.

Steps 1-3 are the one in-cluster runner (:mod:`mpilaunch.job.in_cluster`: the
lifecycle and the mpirun workload that a launcher on the submitting machine
runs) with :class:`ReadyPods` as the backend: the pods exist already, and the
submitting side releases them. What this module adds is how the pods are
reached and where the outcome goes (the last log line, or, detached, the root
ConfigMap).

Standard library plus mpilaunch's pure modules: no Kubernetes client.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

from ....core import env_names, mpi
from ....core.errors import AllocationError, MpilaunchError, UsageError
from ....core.exit_codes import EXIT_FAILED, EXIT_USAGE
from ....core.launcher_lines import error_line, swap_line_after
from ....core.result import JobResult
from ....core.spec import JobSpec, Plan
from ....job.in_cluster import run_launch
from ....job.lifecycle import make_rundir
from ....runtime import summary
from ... import rendezvous
from ...base import BaseBackend, Capabilities
from ...cluster_notes import ClusterNotes
from ...launch_description import LaunchDescription
from ...protocols import ReplacesWorkers
from ...spare_pool import served
from .. import mesh
from ..api import Api, ApiError, sa_dir
from ..exec_path import relay
from ..launch import CLUSTER_DOMAIN, agent_context, exec_api_context, job_secret_names
from ..pod_events import FirstPendingWatch
from ..pods import LAUNCHER_DONE, LAUNCHER_READY, WORKER_CONTAINER, pod_loss, ready_poll_s
from . import dns
from .detached import delete_secrets, outcome, record_outcome


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def wait_workers(api: Api, names: list[str], deadline: float) -> dict[str, dict]:
    """Each worker pod once it is Ready, by name.

    Between looks it watches the first worker not yet Ready (by name: all the Role grants), so
    the look that finds it Ready comes as the kubelet reports it, not up to a poll later (0.1 s
    on average here, where the first rank line is ~1.3 s). One watch at a time: a job's pods
    turn Ready at the same relist of their kubelet, and the look reads them all.
    """
    with FirstPendingWatch(api) as watch:
        return _wait_workers(api, names, deadline, watch)


def _wait_workers(api: Api, names: list[str], deadline: float, watch: FirstPendingWatch) -> dict[str, dict]:
    pending = list(names)
    ready = {}
    last_error = None
    started = time.monotonic()
    while pending:
        still = []
        for name in pending:
            try:
                pod = api.get("v1", "pods", name)
                if _ready(pod):
                    ready[name] = pod
                else:
                    still.append(name)
            except ApiError as e:
                if e.status == 403:
                    raise UsageError(
                        f"the launcher may not read pod {name}: {e.message}", "check the job's Role"
                    ) from None
                last_error = e.message
                still.append(name)
            except OSError as e:
                # the API server unreachable for a moment (seen on real pods: a connect
                # that timed out) is no reason to fail; past the deadline it is, in one line
                last_error = f"cannot reach the API server: {e}"
                still.append(name)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                raise MpilaunchError(
                    f"{len(pending)} workers not ready: {', '.join(pending[:5])}"
                    + (f" ({last_error})" if last_error else ""),
                    None,
                )
            watch.wait(pending, ready_poll_s(time.monotonic() - started, len(pending)))
    return ready


def in_cluster_credentials(launch: LaunchDescription) -> dict:
    return {"in_cluster": True, "sa_dir": sa_dir(), "namespace": launch.cluster["namespace"]}


# Hydra's proxies (a flavour's proxies_connect_back) connect back to the launcher by its
# name (hydra has no address to give them instead), so that name must resolve in the workers first.
NAME_WAIT_S = 60.0


def wait_own_name(launch: LaunchDescription, deadline: float) -> None:
    """Until the cluster's DNS resolves this pod's name to its IP.

    Seen on real pods (1 MPICH launch in 6): the launcher started mpiexec
    before CoreDNS had its record (the endpoints of a just-started pod), the
    proxies failed with "unable to get host address for <job>-launcher" and
    hydra then hung instead of exiting.
    """
    server = dns.nameserver()
    if server is None:
        return  # no cluster DNS to ask; hydra's own error will say what is wrong
    host = socket.gethostname()
    fqdn = f"{host}.{launch.job}.{launch.cluster['namespace']}.svc.{CLUSTER_DOMAIN}"
    own = socket.gethostbyname(host)  # /etc/hosts: the pod's IP
    until = min(deadline, time.monotonic() + NAME_WAIT_S)
    seen: list[str] = []
    while True:
        try:
            seen = dns.query_a(server, fqdn)
        except OSError:
            seen = []
        if own in seen:
            return
        if time.monotonic() > until:
            raise MpilaunchError(
                f"the launcher's name {fqdn} does not resolve to {own} in the cluster's DNS "
                f"({server} answers {seen or 'nothing'}); the MPI's proxies could not reach it",
                "check the job's headless Service and the cluster DNS",
            )
        time.sleep(0.2)


class LauncherEvents(ClusterNotes):
    """The in-cluster launcher's notes: Warning Events posted with the job's own identity (its Role
    may create events). A worker's (--preflight runs here, where mpirun does, attached or not) goes
    on its pod as waited for, which gives its uid. The hang verdict: an attached job's submitting
    mpilaunch posts it (one Event per hang); a detached job's launcher, which nobody follows, posts
    it on its own pod, named by the downward API (``POD_NAME``, ``POD_UID``, k8s-launcher.yaml.j2):
    the pod's hostname is set for DNS instead, and the job's Role may not read this pod (the Job
    controller names it)."""

    def __init__(self, creds: dict, namespace: str, pod_of, detached: bool):
        # pod_of: worker -> its pod as waited for (the backend's, once the workers are ready)
        self.creds, self.namespace, self.pod_of, self.detached = creds, namespace, pod_of, detached

    def hang(self, verdict: str) -> bool:
        if not self.detached:
            return False
        from .. import hang_event

        hang_event.post_on_own_pod(Api(self.creds), self.namespace, os.environ, verdict)
        return True

    def on_worker(self, worker: str, reason: str, text: str) -> bool:
        from .. import hang_event

        Api(self.creds).create(hang_event.hang_event(self.namespace, self.pod_of(worker), text, reason=reason))
        return True


class ReadyPods(BaseBackend, ReplacesWorkers):
    """The job's worker pods, seen from inside the cluster: waited for, exec'd into, never created or
    deleted. With ``--retries`` and ``--spares`` it swaps a lost worker's place to a spare pod that
    is Ready (``launch.relaunches``, ``cluster["spares"]``): mpirun runs again from this same pod,
    with no new launcher pod to schedule and start; the submitting side, told by a signed line
    (``swapped``), deletes the lost pod and asks for a new spare. Without a spare waiting the job
    ends here as before, and the submitting side relaunches with a new launcher pod."""

    name = "k8s"
    capabilities = Capabilities(replace_workers=True, spares=True)

    def __init__(self, spec: JobSpec, plan: Plan, rundir: Path, launch: LaunchDescription, info: mpi.MpiInfo):
        super().__init__(spec, plan, rundir)
        self.launch = launch
        self.info = info
        self.creds = in_cluster_credentials(launch)
        self.relay = None
        self.pods: dict[str, dict] = {}  # worker -> the pod that serves it
        # --spares: the spare pod serving a worker, as the submitting side swapped them (k8s/spares.py)
        self.serving: dict[str, str] = serving_of(os.environ)
        # the spare pods this launcher may swap in (its Role names them; some may not exist yet)
        self.spare_names: tuple[str, ...] = tuple(launch.cluster.get("spares") or ())
        self.cluster_notes = LauncherEvents(
            self.creds, launch.cluster["namespace"], lambda worker: self.pods[worker], launch.detach
        )

    def member(self, worker: str) -> str:
        return self.serving.get(worker, worker)

    def allocate(self) -> None:
        pass  # the submitting side created the pods

    def wait_ready(self, deadline: float, progress) -> None:
        pods = wait_workers(Api(self.creds), [self.member(w.name) for w in self.plan.workers], deadline)
        self.pods = {w.name: pods[self.member(w.name)] for w in self.plan.workers}
        if mpi.for_name(self.info.flavour).proxies_connect_back:
            wait_own_name(self.launch, deadline)
        # LAUNCHER_READY: the submitting side marks mpirun_started when it sees this line
        print(
            f"{LAUNCHER_READY}{self.info.flavour} {self.info.version}, {len(self.plan.workers)} workers ready",
            file=sys.stderr,
            flush=True,
        )

    def exec_context(self) -> dict:
        if self.launch.cluster.get("transport") == "agent":
            context = agent_context(self.launch.cluster["agent_secret_file"], self.pods, in_pod=True)
        else:
            context = exec_api_context(
                self.creds, [w.name for w in self.plan.workers], self.launch.cluster.get("container", WORKER_CONTAINER)
            )
        # a worker a spare serves: its pod, and the spare named (the shim gives the ranks the worker's name)
        context["workers"] = served(
            {w: {**e, "pod": self.member(w)} if "pod" in e else e for w, e in context["workers"].items()}, self.serving
        )
        if self.launch.cluster.get("transport") == "agent":
            return context
        if os.environ.get(env_names.K8S_RELAY, "1") != "0":
            self.release()  # a relaunch's context (a spare swapped in): one relay, for the new pods
            self.relay, context["relay"] = relay.start(dict(context), self.rundir)
        return context

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        """Worker pods deleted, evicted or failed, read pod by pod (all the Role allows)."""
        api, lost = Api(self.creds), {}
        for w in self.plan.workers:
            try:
                pod = api.get("v1", "pods", self.member(w.name))
            except ApiError as e:
                if e.status != 404:
                    continue  # no verdict on an error
                pod = None
            except OSError:
                continue
            reason = pod_loss(pod)
            if reason is not None:
                lost[w.name] = reason
        return lost

    def spare_pods(self) -> list[tuple[str, dict]]:
        """(name, pod) of the spare pods made and serving no worker, in the order they were asked for
        (a get each, by name: all the Role allows; one not made yet, or not answered, is left out)."""
        api, serving, found = Api(self.creds), set(self.serving.values()), []
        for name in self.spare_names:
            if name in serving:
                continue
            try:
                found.append((name, api.get("v1", "pods", name)))
            except (ApiError, OSError):
                continue
        return found

    def waiting_spares(self) -> list[str]:
        """The spare pods Ready now and serving no worker, oldest first."""
        return [name for name, pod in self.spare_pods() if _ready(pod) and pod_loss(pod) is None]

    def spares_waiting(self) -> int:
        return len(self.waiting_spares())

    def spares_coming(self) -> int:
        return sum(1 for _, pod in self.spare_pods() if not _ready(pod) and pod_loss(pod) is None)

    def worker_changes(self):
        """Set when a shim's agent session ends (``runtime/exit_notes.py``): the lost-worker watch reads
        the pods at once instead of at its next look, 2 s apart (a relaunch onto a spare waited)."""
        from ....runtime.exit_notes import noted_exits

        return noted_exits(self.rundir)

    def can_replace(self, names: list[str]) -> bool:
        """Only a spare that waits: this pod may create no pod (its Role is read and exec only)."""
        return self.spares_waiting() >= len(names)

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        waiting = self.waiting_spares()
        if len(waiting) < len(names):  # can_replace said yes a moment ago: a spare was lost since
            raise AllocationError(
                f"{len(names)} worker{'s' if len(names) > 1 else ''} to replace and {len(waiting)} spare pod"
                f"{'s' if len(waiting) != 1 else ''} Ready",
                "run again; add --spares for more room",
            )
        taken = {}
        for name in names:
            taken[name] = self.serving[name] = waiting.pop(0)
            self.pods.pop(name, None)  # wait_ready reads the spare's pod
        return taken

    def swapped(self, taken: dict[str, str], why: str, ended) -> None:
        """The submitting side's word (pods.LAUNCHER_SWAP's signed line): it deletes the replaced pods
        and asks for new spares, and keeps the ended attempt in the job's record."""
        print(swap_line_after(taken, why, ended, self.launch.status_token), file=sys.stderr, flush=True)

    def rank_prefix(self) -> list[str]:
        python = os.environ.get(env_names.K8S_PYTHON)
        if python:  # the tests' stand-in for a pod's python3 (kwok runs pods' commands here)
            return [python, "-m", "mpilaunch.rank"]
        return list(self.launch.rank_prefix)

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        return rendezvous.pod_rendezvous(self.member(worker), self.plan.job_name)

    def release(self) -> None:
        if self.relay is not None:
            relay.stop(self.relay)
            self.relay = None

    def describe_workers(self) -> dict[str, dict]:
        """The node each worker pod runs on, as waited for (the preflight's lines name it)."""
        return {name: {"node": (pod.get("spec") or {}).get("nodeName")} for name, pod in self.pods.items()}


def serving_of(environ) -> dict[str, str]:
    """``MPILAUNCH_SERVING`` (a relaunch's, k8s/spares.py ``serving_env``): worker -> spare pod."""
    try:
        said = json.loads(environ.get(env_names.SERVING) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}


def finish_detached(creds: dict, launch: LaunchDescription, result) -> None:
    """A detached job has no one on the submitting side: record its outcome, release its workers.

    The outcome goes into the job's root ConfigMap (``result.json``, read by
    ``mpilaunch wait`` and ``status``); the worker pods are deleted so their
    GPUs go back at once, and once the outcome is recorded the job's Secrets
    (the forwarded values, the agents' private key), which nothing reads any
    more. The root, the launcher's Job and its log stay until ``mpilaunch
    delete NAME``.
    """
    api = Api(creds)
    failure = result.failure
    if failure == "interrupted by SIGTERM":  # in a pod, only the cluster sends it
        failure = (
            "the launcher pod was stopped by the cluster (SIGTERM: deleted, evicted, preempted, or past its deadline)"
        )
    if result.exit_code != 0 and failure:
        print(f"mpilaunch: error: {failure}", file=sys.stderr, flush=True)
    # the job's report as its summary reads (the launch description's spec names no backend)
    report = None if result.report is None else {**result.report, "exit_code": result.exit_code, "failure": failure}
    if report is not None:
        report["backend"] = "k8s"
    recorded = False  # by this launcher or, first, by the reaper
    try:
        posted = {} if report is None else {"summary": summary.compact(report)}  # what `mpilaunch wait` prints
        record = outcome(result.exit_code, failure, [r.__dict__ for r in result.ranks], **posted)
        if not record_outcome(api, launch.job, record):  # the first record wins
            print("mpilaunch: launcher: the job's reaper recorded the outcome first", file=sys.stderr)
        recorded = True
    except (ApiError, OSError) as e:
        print(f"mpilaunch: launcher: cannot record the outcome in ConfigMap {launch.job}: {e}", file=sys.stderr)
    for name in launch.addresses():
        try:
            api.delete("v1", "pods", name, gracePeriodSeconds=0)
        except (ApiError, OSError) as e:
            print(f"mpilaunch: launcher: cannot delete worker pod {name}: {e}", file=sys.stderr)
    if recorded:  # else the reaper records the outcome, and then deletes them
        delete_secrets(
            api,
            job_secret_names(launch.job, launch.cluster.get("transport")),
            lambda message: print(f"mpilaunch: launcher: {message}", file=sys.stderr),
        )
    print(
        f"mpilaunch: launcher: job {launch.job} ended with exit code {result.exit_code}; workers released",
        file=sys.stderr,
        flush=True,
    )
    if report is not None:  # the log ends with the job's closing summary (`mpilaunch logs NAME`)
        print("\n".join(summary.lines(report)), file=sys.stderr, flush=True)


def read_secret(launch: LaunchDescription) -> dict:
    """The Secret's part of the launch description (the forwarded values, the status token),
    mounted where ``secret_file`` says (``launch.SECRET_DIR``); ``{}`` when it names none."""
    path = launch.cluster.get("secret_file")
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise MpilaunchError(
            f"cannot read the job's Secret at {path}: {getattr(e, 'strerror', None) or e}",
            f"the launcher pod mounts Secret {launch.job}-env there; check that it exists",
        ) from None


def this_attempt(launch: LaunchDescription, environ) -> LaunchDescription:
    """The description with this pod's attempt number. Every attempt's launcher Job mounts the
    same launch.json (the root ConfigMap's); a relaunch (``--retries``) makes a Job that says its
    attempt in ``MPILAUNCH_ATTEMPT`` (``replace.relaunch_launcher``), and from here on it is the
    description's field, as on YARN (whose launcher is handed a description per attempt)."""
    return dataclasses.replace(launch, attempt=int(environ.get(env_names.ATTEMPT, launch.attempt)))


def pass_through(stream: str, line: str) -> None:
    """mpirun's lines to the pod log as they are: the submitting side parses them."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.write(line)
    out.flush()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mpilaunch.backends.k8s.in_cluster.launcher LAUNCH_JSON", file=sys.stderr)
        return EXIT_USAGE
    launch = LaunchDescription.from_dict(json.loads(Path(argv[0]).read_text()))
    result = JobResult(job_name=launch.job, exit_code=EXIT_FAILED, failure="the launcher failed before mpirun ran")
    try:
        launch = this_attempt(launch.with_secrets(read_secret(launch)), os.environ)
        info = mpi.find_mpirun(launch.mpi, launch.mpirun, os.environ.get("PATH"))
        rundir = make_rundir(launch.job)
        result, workload = run_launch(
            launch, info, rundir, lambda spec, plan: ReadyPods(spec, plan, rundir, launch, info), pass_through
        )
        if not launch.detach:  # the submitting side ends on this line (pods.LAUNCHER_DONE)
            print(f"{LAUNCHER_DONE}{result.exit_code} token={workload.token}", file=sys.stderr, flush=True)
    except MpilaunchError as e:
        # attached: one signed line the submitting side raises again (core/launcher_lines.py)
        print(e.format() if launch.detach else error_line(e, launch.status_token), file=sys.stderr, flush=True)
        result = JobResult(job_name=launch.job, exit_code=e.exit_code, failure=e.message)
    finally:
        if launch.detach:  # every exit path: nobody else will release a detached job's workers
            finish_detached(in_cluster_credentials(launch), launch, result)
        # last: a kept mesh's sidecar ends, so that this Job can complete
        mesh.quit_if_injected(lambda message: print(f"mpilaunch: {message}", file=sys.stderr, flush=True))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
