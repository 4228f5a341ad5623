"""Kubernetes backend: worker pods reached through mpilaunch's exec agent or the exec API, not SSH.

What one job creates (jinja2 templates in ``mpilaunch/backends/k8s/templates/k8s-*.j2``,
rendered by :mod:`.manifests`; ``mpilaunch render`` prints them):

* a root ConfigMap ``<job>`` (hostfile, plan, the launcher's ``launch.json``)
  that owns every other object through ownerReferences: deleting it, or
  ``mpilaunch delete NAME``, garbage-collects the job;
* with the cluster launcher, a Secret ``<job>-env`` with what the ConfigMap
  must not show to everyone who may read it (the built-in ``view`` role
  reads ConfigMaps, not Secrets): the forwarded variables' values (``-x``,
  ``NCCL_*``, ``HOROVOD_*``) and the launch's status token, mounted into the
  launcher pod only;
* ServiceAccount + Role + RoleBinding ``<job>-launcher``: ``get``/``watch pods``
  on this job's worker pods by name, and ``create/get pods/exec`` on them with
  ``--transport exec`` only; detached, also what ending the job takes (the
  workers', the root's and the Secrets' by name, and ``create events`` for
  the hang verdict), nothing else (``rbac.py``);
* with ``--transport agent``, a Secret ``<job>-agent``: the secret the
  workers' agents and the shims share, mounted into the job's pods;
* a reaper Job ``<job>-reaper``: attached, with a Lease ``<job>`` this process
  renews, it deletes the job when the renewals stop for ``--orphan-timeout``
  or at the cluster-side deadline (:mod:`.orphan`); detached, it watches
  the launcher Job and, should the launcher end without recording the
  outcome, records one and releases the workers (:mod:`.in_cluster.detached`);
* a headless Service ``<job>`` (``<pod>.<job>`` resolves for workers and the
  launcher, ready or not);
* one Pod per worker, ``<job>-worker-<i>``, with ``nvidia.com/gpu`` limits,
  node selector, tolerations, priority class, a memory ``/dev/shm``; its
  main process is mpilaunch's exec agent on the pod IP (``--transport
  agent``: the shims reach it over the pod network, no exec stream through
  the API server per daemon), or a sleep (``--transport exec``);
* optionally a PodGroup (``--gang volcano|coscheduling``; ``--queue``: Kueue labels on the workers);
* with ``--launcher cluster`` (the default) a Job ``<job>-launcher`` whose
  pod runs :mod:`mpilaunch.backends.k8s.in_cluster.launcher` with the job's
  ServiceAccount: it waits for the workers itself (no launcher racing
  workers), detects the image's MPI and runs mpirun with ``mpilaunch-rsh``.
  The CLI streams its log and takes its exit status.

``wait_ready`` is all or nothing: every worker Ready before
``--start-timeout``, else ``AllocationError`` (exit 3) quoting the cluster
(scheduler messages such as ``0/16 nodes are available: 16 Insufficient
nvidia.com/gpu``, image pull errors) — and ``release`` deletes everything on
every exit path.

The exec transport (:mod:`mpilaunch.backends.k8s.exec_path.transport`) is a stdlib
websocket client: one TLS connection per daemon, no kubectl and no client
library per shim. The agent transport is the local and YARN backends'
(``rsh_agent/transports/agent.py``), given the pods' IPs
(``launch.agent_context``). The ``kubernetes`` package is used only to read
kubeconfigs (exec plugins, auth providers); API calls use a small stdlib
REST client (:mod:`.api`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import time

from ...core import env_names, mpi, phases
from ...core.errors import UsageError
from .. import rendezvous
from ..agent_credential import new_credential
from ..base import BaseBackend, Capabilities
from ..protocols import ClusterLauncher, JobsByName, ReplacesWorkers
from ..spare_pool import LauncherSwaps, SparePool
from . import (
    creation,
    follow,
    hang_event,
    launch,
    launcher_placement,
    manage,
    manifests,
    pod_events,
    pod_template,
    replace,
    startup,
    tools,
)
from . import spares as k8s_spares
from .admission import AdmissionReader
from .api import Api, ApiError, ApiOutage, resolve_with_tokens
from .credentials import refused
from .options import K8sOptions
from .pod_events import waiter
from .pods import (
    JOB_LABEL,
    pod_description,
    pod_loss,
)

# How long after its workers turned Ready a failed job's diagnosis waits for the cluster's word:
# a worker whose container ends just after the kubelet saw it start (an image that cannot run
# mpilaunch's pieces) is reported at the kubelet's next relist, a second later, while mpirun
# has already failed to reach it. Two relists and a margin.
SETTLE_AFTER_READY_S = 2.5


class K8sBackend(BaseBackend, ClusterLauncher, JobsByName, ReplacesWorkers):
    name = "k8s"
    options_class = K8sOptions
    capabilities = Capabilities(
        detach=True, replace_workers=True, spares=True, cluster_launcher=True, manage=True, render=True
    )
    named_job = manage.K8sNamedJob

    def __init__(self, spec, plan, rundir, *, cluster_launcher_allowed: bool = True):
        super().__init__(spec, plan, rundir, cluster_launcher_allowed=cluster_launcher_allowed)
        self.opts: K8sOptions = self.options
        self.job = plan.job_name
        self.launcher_name = launch.launcher_job_name(self.job)
        self._creds: dict | None = None
        self._tokens = None  # a k8s_credentials.TokenSource when the kubeconfig's token expires
        self._api: Api | None = None
        self._namespace: str | None = None
        self.root_uid: str | None = None
        # the root's create was sent: it may exist even where the answer was an error (a timeout, a
        # connection reset after the API server stored it); CREATOR_ANNOTATION tells it apart
        self.root_sent = False
        self.creator = secrets.token_hex(8)
        self.created: list[tuple[str, str, str]] = []  # (apiVersion, plural, name)
        self.launcher_pod: str | None = None
        self.ready_at: float | None = (
            None  # when wait_ready saw every worker Ready (a failed run's diagnosis settles after it)
        )
        self.pods: dict[str, dict] = {}
        # --network-policy job: the roles of the job's pods that the namespace's own NetworkPolicies
        # isolate for egress (allocate asks; None: not asked, a render)
        self.egress_isolated_roles: list[str] | None = None
        # ... and what the cluster says of its DNS and API server (network_setup.egress_peers; None: not asked)
        self.egress_peers: dict | None = None
        self.relay = None
        self.heartbeat = None
        self._outage = ApiOutage("the job's pods")
        self._admission = None
        self.launcher_events_at = 0.0  # when the launcher Job's events may be read again (startup.py)
        # mpilaunch's pieces come with the job (its ConfigMap), not from the image (tools.py)
        self.tools = tools.from_configmap()
        # where mpirun runs, chosen once: what differs between the two lives there (launcher_placement.py)
        self.launcher_placement = launcher_placement.for_launcher(self.launcher)
        self.transport = launch.resolve_transport(self.opts.transport, self.launcher_placement)
        k8s_spares.check(spec, self.launcher_placement, self.opts)
        # --spares: spare worker pods (k8s/spares.py), and which one serves which worker
        self.spares = SparePool.for_plan(plan)
        # what the hang diagnosis and the preflight find, as Warning Events on the job's pods
        self.cluster_notes = hang_event.PodEvents(lambda: (self.api, self.namespace), self._hang_pod, self.member)
        self.spare_pods: list[str] = []  # created, serving no worker yet
        self.launcher_swaps = LauncherSwaps()  # the launcher pod's own swaps (relaunched_in_launcher)
        self.spare_template: dict | None = None
        if self.opts.queue and spec.retries:
            raise UsageError(
                "--retries cannot be used with --queue",
                "Kueue admits a job's pod group once: a replaced worker would wait for an admission "
                "that does not come; leave out --retries, or --queue",
            )
        # --transport agent: the workers' agents and the shims share it (Secret <job>-agent)
        self.agent_secret = new_credential() if self.transport == "agent" else ""  # MAC secret + TLS cert/key
        self.agent_secret_file = rundir / "agent-secret"
        # --pod-template: read once, here, so that a bad file is exit 2 before anything is created
        self.pod_templates = pod_template.load(self.opts.pod_template) if self.opts.pod_template else None
        # the launcher's own template's serviceAccountName acts as --service-account (no per-job RBAC
        # is made); the one of the document for every role is the workers' alone, and said so once
        account = pod_template.launcher_service_account(self.pod_templates, self.opts.service_account)
        if account != self.opts.service_account:
            self.opts = dataclasses.replace(self.opts, service_account=account)
        warning = pod_template.shared_account_warning(self.pod_templates, account)
        if warning:
            print(warning, file=sys.stderr, flush=True)

    # ------------------------------------------------------------ cluster access

    @property
    def admission(self) -> AdmissionReader:
        """The job's PodGroup and Kueue Workload (--gang, --queue), read for why the job waits."""
        if self._admission is None:
            self._admission = AdmissionReader(self.api, self.opts.gang, self.opts.queue, self.job)
        return self._admission

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            if self.opts.namespace:
                self._namespace = self.opts.namespace
            else:
                try:
                    self._namespace = self.credentials()["namespace"]
                except UsageError:
                    self._namespace = "default"  # render without a cluster
        return self._namespace

    def api_server(self) -> str | None:
        """The kubeconfig's server URL, None where there is none (a render without a cluster)."""
        try:
            return self.credentials().get("server")
        except UsageError:
            return None

    def credentials(self) -> dict:
        """The kubeconfig's server, CA and client credentials, resolved once (exec plugins run then)."""
        if self._creds is None:
            self._creds, self._tokens = resolve_with_tokens(
                self.opts.kubeconfig, self.opts.context, self.opts.namespace, self.rundir
            )
        return self._creds

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(self.credentials(), tokens=self._tokens)
            if self._tokens is not None:
                self._tokens.start()  # refreshed from here on, for this process, the relay and the shims
        return self._api

    @classmethod
    def remote_mpi_info(cls, spec):
        """The mpirun workload asks when there is no mpirun here: the launcher pod brings its own."""
        return launch.image_mpi_info(spec) if launcher_placement.for_launcher(spec.launcher).in_cluster else None

    # ------------------------------------------------------------ manifests

    def check_image(self) -> str:
        if not self.opts.image:
            raise UsageError("--backend k8s needs --image", "give the worker image, e.g. --image myorg/horovod:latest")
        return self.opts.image

    def launch_description(self):
        return launch.launch_description(
            self.spec,
            self.plan,
            self.job,
            self.namespace,
            self.rank_prefix(),
            self.status_token,
            os.environ,
            self.transport,
            # the spares the launcher pod swaps in itself (k8s/spares.py)
            tuple(self.launcher_placement.spare_names_for_role(self)) if self.spec.spares else (),
        )

    def manifests(self, reveal: bool = False) -> list[tuple[str, str]]:
        """``(group, yaml text)`` in creation order (:func:`.manifests.manifests`)."""
        return manifests.manifests(self, reveal)

    def objects(self, reveal: bool = False) -> list[tuple[str, dict]]:
        return manifests.objects(self, reveal)

    def render(self) -> str:
        return manifests.render(self)

    # ------------------------------------------------------------ life cycle

    def allocate(self) -> None:
        objects = self.objects(reveal=True)  # usage errors (image, tolerations) before touching the cluster
        api = self.api
        if not self.opts.service_account:  # may this user make the per-job identities? (exit 2 before anything)
            from .rbac import check_may_create_identities

            check_may_create_identities(api, self.namespace)
        from . import network_setup

        # the job's NetworkPolicies as the cluster's answers shape them, asked beside admission's check
        objects = network_setup.with_policies(self, objects, lambda objs: creation.admission_check(self, objs))
        self.launcher_placement.before_create(self)
        creation.create_objects(self, objects)
        if self.spec.spares:  # after the workers, never waited for: a spare must not hold the job back
            self.spare_template = k8s_spares.template_pod(objects, self.plan)
            if not k8s_spares.after_the_gang(self.opts):
                k8s_spares.ask(self, self.spec.spares)

    def member(self, worker: str) -> str:
        """The pod that serves ``worker`` now: a spare's (--spares), else the worker's own."""
        return self.spares.member_of(worker)

    def spares_waiting(self) -> int:
        return k8s_spares.waiting(self)

    def spares_coming(self) -> int:
        return k8s_spares.coming(self)

    def wait_ready(self, deadline: float, progress) -> None:
        with waiter(self.api, self.namespace, f"{JOB_LABEL}={self.job}", len(self.plan.workers)) as wait:
            startup.wait_for_ready(self, deadline, progress, wait)
        if self.spec.spares and k8s_spares.after_the_gang(self.opts) and not self.spares.asked:
            k8s_spares.ask(self, self.spec.spares)
        self._let_in_submitter()

    def _let_in_submitter(self) -> None:
        from . import network_setup

        network_setup.let_in_submitter(self, self.control_address())  # --launcher local

    def exec_context(self) -> dict:
        """How the shims reach the worker pods, and this side's channel to them (``launcher_placement.exec_context``)."""
        return self.launcher_placement.exec_context(self)

    def rank_prefix(self) -> list[str]:
        return tools.rank_prefix(self.tools, os.environ.get(env_names.K8S_PYTHON, "python3"))

    def _hang_pod(self) -> str:
        return self.launcher_placement.hang_pod(self)

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        return rendezvous.pod_rendezvous(self.member(worker), self.plan.job_name)

    def control_address(self) -> str | None:
        return self.launcher_placement.control_address(self)

    # ------------------------------------------------------------ cluster launcher

    def _launcher_ready(self, output, said: str) -> None:
        phases.mark(self.phase_times, "mpirun_started")
        info = mpi.announced_mpi(said)
        if info is not None:  # the image's mpirun tags its ranks' lines, not the one found here
            output.ompi_tag_space = mpi.tag_has_space(info)

    def run_launcher(self, output, deadline: float | None) -> int | None:
        """Follow the launcher pod: its log into ``output``, its exit code back (:func:`.follow.run_launcher`)."""
        return follow.run_launcher(
            self.api,
            self.namespace,
            self.launcher_pod,
            self.status_token,
            output,
            deadline,
            lambda said: self._launcher_ready(output, said),
            lambda text: self._launcher_swapped(output, text),
        )

    def launcher_takes_lost_workers(self) -> bool:
        """--retries with --spares and the launcher pod: it swaps a Ready spare in itself (k8s/spares.py)."""
        return self.launcher_in_cluster and bool(self.spec.spares) and bool(self.spec.retries)

    def _launcher_swapped(self, output, text: str) -> None:
        self.launcher_swaps.take(text, self.status_token, output, lambda s: k8s_spares.taken_by_launcher(self, s))

    def relaunched_in_launcher(self) -> list[dict]:
        return self.launcher_swaps.drain()

    # ------------------------------------------------------------ reports, teardown

    def hand_off(self, deadline: float, progress) -> None:
        """--detach: the launcher Job exists; it waits for the workers and cleans up itself."""

    def manage_flags(self) -> str:
        flags = f"--backend k8s --namespace {self.namespace}"
        if self.opts.context:
            flags += f" --context {self.opts.context}"
        if self.opts.kubeconfig:
            flags += f" --kubeconfig {self.opts.kubeconfig}"
        return flags

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        """A Ready spare pod for each (--spares), else delete the worker's pod (if anything is left of
        it) and create it anew, same name and manifest."""
        if not self.spec.spares:
            replace.replace_workers(self, names)
            return {}
        return k8s_spares.swap(self, names, why, lambda rest: replace.replace_workers(self, rest))

    def relaunch(self, attempt: int) -> None:
        self.launcher_placement.relaunch(self, attempt)

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        """Worker pods the cluster deleted, evicted or failed (one list call; kept for the report).

        Raises CredentialError when the credentials failed (the watch stops the job); any
        other failed call is no verdict, and is said on stderr if it lasts."""
        self.api.check_credentials()
        settle_until = (self.ready_at or 0.0) + SETTLE_AFTER_READY_S if settle else 0.0
        while True:
            try:
                pods = {p["metadata"]["name"]: p for p in startup.list_pods(self.api, self.job)}
                self._outage.ok()
            except ApiError as e:
                if e.status == 403:
                    raise refused(e.status, e.message, "listing the job's pods") from None
                return self._outage.failed(e) or {}
            except (OSError, ValueError) as e:
                return self._outage.failed(e) or {}
            lost = {
                w.name: reason
                for w in self.plan.workers
                if (reason := pod_loss(pods.get(self.member(w.name)))) is not None
            }
            if lost or time.monotonic() >= settle_until:
                break
            time.sleep(min(0.25, max(0.0, settle_until - time.monotonic())))
        # as the wait for Ready says it: the image, not a lost worker
        startup.fail_on_image_check(tools.termination_messages(pods.get(self.member(name))) for name in lost)
        evicted = self.admission.eviction() if lost else None
        if evicted:  # Kueue took the pods back: its reason is the job's, whatever each pod says
            lost = dict.fromkeys(lost, evicted)
        for name in map(self.member, lost):
            if name in pods:
                self.pods[name] = pods[name]  # a deleted pod keeps its last known node and IP
        return lost

    def worker_changes(self):
        """A watch on the job's pods: a deleted or evicted worker is asked about at once (a lost
        worker seen up to WATCH_INTERVAL_S later held every --retries relaunch back)."""
        return pod_events.changes(self.api, self.namespace, f"{JOB_LABEL}={self.job}", len(self.plan.workers))

    def describe_workers(self) -> dict[str, dict]:
        return {
            w.name: pod_description(self.pods.get(self.member(w.name)), self.member(w.name), self.namespace, w.gpus)
            for w in self.plan.workers
        }

    def release(self) -> None:
        if self._tokens is not None:
            self._tokens.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.relay is not None:
            from .exec_path import relay

            relay.stop(self.relay)
            self.relay = None
        if self.root_uid is None and self.root_sent:
            self.root_uid = creation.root_made_unanswered(self)
        if self.root_uid is None:
            return
        try:
            manage.delete_job(self.api, self.job, self.created, wait=20.0, root_uid=self.root_uid)
        except Exception as e:  # never raise from teardown
            print(
                f"mpilaunch: warning: cleanup of job {self.job} incomplete ({e}); the cluster's reaper deletes it "
                f"--orphan-timeout {self.spec.orphan_timeout:g}s after the last Lease renewal, or "
                f"run: mpilaunch delete {self.job} --backend k8s",
                file=sys.stderr,
            )
        self.root_uid = None
