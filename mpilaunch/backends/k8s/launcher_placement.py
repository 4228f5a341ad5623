"""Where a Kubernetes job's mpirun runs, chosen once per job: a strategy object instead of branches.

``--launcher cluster`` (:class:`PodLauncher`, the default): mpirun runs in a launcher pod the job
creates (a Job, its Role and Secret); this process follows its log. ``--launcher local``
(:class:`SubmitterLauncher`): mpirun runs here and its shims reach the worker pods from this
machine. Everything that differs between the two (which objects the job makes, what the wait
for Ready waits for, how the shims reach the pods, where a hang verdict is posted, what a
relaunch does, which spares a Role must name) is a method here; the backend asks its
``launcher_placement`` and never tests ``launcher == "cluster"`` itself.
"""

from __future__ import annotations

import json
import os

from ...core import env_names, phases
from ...core.errors import UsageError
from .. import rendezvous
from ..agent_workers import write_secret
from ..spare_pool import served
from . import launch
from .pods import launcher_started, pod_problem


def use_relay() -> bool:
    return os.environ.get(env_names.K8S_RELAY, "1") != "0"


def exec_api_context(backend) -> dict:
    """The exec API's context: the shims' with --transport exec, and this side's channel to the
    pods whatever the transport (the hang probe's, ``hang.collect``)."""
    creds = dict(backend.credentials())
    creds.pop("token", None)  # in memory only when no rundir; never the case here
    context = launch.exec_api_context(creds, [w.name for w in backend.plan.workers])
    pods_of = {w: {"pod": backend.member(w)} for w in context["workers"]}
    context["workers"] = served(pods_of, backend.spares.serving)
    return context


class LauncherPlacement:
    """What both placements answer alike."""

    def worker0_pod(self, backend) -> str:
        """The pod serving the plan's first worker, mpirun's first host."""
        return backend.member(backend.plan.workers[0].name)


class SubmitterLauncher(LauncherPlacement):
    """``--launcher local``: mpirun runs on this machine, its shims reach the pods from here."""

    in_cluster = False
    default_transport = "exec"  # no pod network from here to count on; the API server is reachable
    own_pods = 0  # pods of its own the wait for Ready waits for, beside the workers

    def check_spares(self, spec, opts) -> None:
        """Nothing this placement refuses: a swap happens here, where the hostfile is written."""

    def launch_json(self, backend) -> str:
        return ""  # no launcher pod to describe the launch to

    def secret_json(self, backend, reveal: bool) -> str:
        return ""

    def setup_templates(self, own_identities: bool) -> list[str]:
        return []

    def launcher_templates(self) -> list[str]:
        return []

    def spare_names_for_role(self, backend) -> list[str]:
        return []  # no launcher pod, no Role to name them in

    def before_create(self, backend) -> None:
        if backend.transport == "agent":  # this side's shims read it here
            write_secret(backend.agent_secret_file, backend.agent_secret)

    def check_launcher_pod(self, backend, pods: list[dict], fatal: dict, problems: dict) -> bool:
        return True  # there is none to wait for

    def exec_context(self, backend) -> dict:
        """The pods' agents from here (``--transport agent``), else the exec API through the job's
        exec relay (default: a shim costs an interpreter start and a unix-socket round trip;
        ``MPILAUNCH_K8S_RELAY=0``: every shim opens its own TLS connection)."""
        if backend.transport == "agent":
            pods = {w.name: backend.pods.get(backend.member(w.name)) for w in backend.plan.workers}
            context = launch.agent_context(str(backend.agent_secret_file), pods, in_pod=False)
            context["workers"] = served(context["workers"], backend.spares.serving)
            return context
        context = exec_api_context(backend)
        if use_relay():
            from .exec_path import relay

            relay.stop(backend.relay)  # a relaunch (--retries) starts a fresh one
            backend.relay, context["relay"] = relay.start(context, backend.rundir)
        return context

    def hang_pod(self, backend) -> str:
        """The pod a hang verdict's Event goes on: worker 0's, mpirun's first host."""
        return self.worker0_pod(backend)

    def control_address(self, backend) -> str | None:
        """This machine's address on the route to the first worker pod (the rendezvous the ranks call back)."""
        pod = backend.pods.get(self.worker0_pod(backend)) or {}
        ip = (pod.get("status") or {}).get("podIP")
        return rendezvous.source_address(ip) if ip else None

    def relaunch(self, backend, attempt: int) -> None:
        """Nothing to recreate: the next attempt's mpirun starts here."""


class PodLauncher(LauncherPlacement):
    """``--launcher cluster``: mpirun runs in the job's launcher pod (a Job with its own Role and
    Secret); it waits for the workers itself and this process follows its log."""

    in_cluster = True
    default_transport = "agent"  # the launcher pod is on the pod network: no exec stream per daemon
    own_pods = 1

    def check_spares(self, spec, opts) -> None:
        if spec.spares and opts.service_account:
            raise UsageError(
                "--spares with the launcher pod needs the job's own Role: one of --service-account names no spare pod",
                "drop --service-account, or use --launcher local",
            )

    def launch_json(self, backend) -> str:
        return json.dumps(backend.launch_description().without_secrets().to_dict(), indent=1)

    def secret_json(self, backend, reveal: bool) -> str:
        return json.dumps(launch.secret_values(backend.launch_description(), reveal), indent=1)

    def setup_templates(self, own_identities: bool) -> list[str]:
        # its Role (unless an admin's --service-account stands in) and the values the ConfigMap must not show
        return (["k8s-rbac.yaml.j2"] if own_identities else []) + ["k8s-secret.yaml.j2"]

    def launcher_templates(self) -> list[str]:
        return ["k8s-launcher.yaml.j2"]

    def spare_names_for_role(self, backend) -> list[str]:
        """The spare pods a launcher pod may take or be told of (a Role names its pods): the K spares,
        and one more for each a swap may take: K for each of --retries relaunches and, with
        --preflight enforce, for each of its two swap rounds (job/spares.py MAX_PREFLIGHT_ROUNDS)."""
        spec = backend.spec
        rounds = 1 + spec.retries + (2 if spec.preflight == "enforce" else 0)
        return [f"{backend.job}-spare-{i}" for i in range(spec.spares * rounds)]

    def before_create(self, backend) -> None:
        """The agents' secret goes to the launcher pod only, in the job's Secret."""

    def check_launcher_pod(self, backend, pods: list[dict], fatal: dict, problems: dict) -> bool:
        """Whether the launcher pod has started; what holds it back goes into ``fatal`` or ``problems``."""
        if not pods:
            return False
        message, is_fatal = pod_problem(pods[0])
        started = launcher_started(pods[0])
        if started:
            phases.mark(backend.phase_times, "launcher_running")
        elif is_fatal:
            fatal[backend.launcher_pod] = message
        else:
            problems[backend.launcher_pod] = message
        return started

    def exec_context(self, backend) -> dict:
        """No shim runs here (the launcher pod holds the agents' secret): the exec API, this side's
        channel to the pods (the hang probe's)."""
        return exec_api_context(backend)

    def hang_pod(self, backend) -> str:
        """The launcher pod, where mpirun runs (worker 0's until it is known)."""
        return backend.launcher_pod or self.worker0_pod(backend)

    def control_address(self, backend) -> str | None:
        return None  # the ranks call the launcher pod, not this machine

    def relaunch(self, backend, attempt: int) -> None:
        """A new launcher Job for attempt ``attempt``; ``wait_ready`` then waits for its pod."""
        from . import replace

        replace.relaunch_launcher(backend, attempt)


def for_launcher(launcher: str) -> LauncherPlacement:
    """The placement of ``launcher``: "local" is this machine, anything else ("cluster", a spec's
    default) the launcher pod."""
    return SubmitterLauncher() if launcher == "local" else PodLauncher()
