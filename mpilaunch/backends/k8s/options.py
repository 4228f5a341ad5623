"""The Kubernetes backend's options: the image, where the pods go, what they may use."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from ...core import declared
from ...core.declared import RESOLVED, SUBMITTING, option
from ...core.errors import UsageError
from ..base import BackendOptions
from .pod_template import check_gpu_resource
from .security import DEFAULT_RUN_AS, parse_run_as

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"

# A Kubernetes resource quantity: 512Mi, 8Gi, 1.5G, 500m, 4.
QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
# A Kubernetes namespace: a DNS-1123 label (part of API paths and of rendered YAML).
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NAMESPACE_HINT = (
    "a namespace is a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters, "
    "starting and ending with a letter or digit, e.g. --namespace ml-team"
)
GANGS = ("none", "volcano", "coscheduling")
GANG_ALIASES = {"scheduler-plugins": "coscheduling"}  # its name before scheduler-plugins' plugin was meant
# A Kueue LocalQueue's name: a DNS-1123 subdomain (a label value too, so at most 63 characters).
QUEUE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
TRANSPORTS = ("auto", "agent", "exec")  # launch.resolve_transport says what auto is
NETWORK_POLICIES = ("job", "strict", "none")
# a Kubernetes object name (DNS-1123 subdomain): a ServiceAccount
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def check_namespace(namespace: str | None) -> None:
    if namespace is not None and not NAMESPACE_RE.fullmatch(namespace):  # fullmatch: not before a trailing newline
        raise UsageError(f"invalid --namespace {namespace!r}", NAMESPACE_HINT)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


# which cluster and namespace: options of a run and of status/logs/delete/wait alike
CLUSTER_FIELDS = ("namespace", "context", "kubeconfig")


@dataclass(frozen=True)
class K8sOptions(BackendOptions):
    """The Kubernetes backend's options; each reaches a detached job's launcher pod as the objects
    made before the hand-off (SUBMITTING), or in the launch description's ``cluster`` (RESOLVED)."""

    backend_class = "mpilaunch.backends.k8s.backend:K8sBackend"
    extra = "k8s"

    image: str | None = option(
        flag="--image",
        detached=SUBMITTING,
        help="the worker and launcher image (any image with an MPI; see docs/kubernetes.md)",
    )
    namespace: str | None = option(
        flag="--namespace",
        detached=RESOLVED,  # the description's cluster["namespace"]
        help="the namespace of the job's objects (default: the kubeconfig's)",
    )
    context: str | None = option(
        flag="--context", detached=SUBMITTING, help="the kubeconfig context (default: its current one)"
    )
    kubeconfig: str | None = option(
        flag="--kubeconfig",
        detached=SUBMITTING,  # the launcher pod uses its own ServiceAccount
        help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    node_selector: tuple[tuple[str, str], ...] = option(
        (),
        flag="--node-selector",
        action="append",
        type=key_value,
        metavar="K=V",
        detached=SUBMITTING,
        help="put the worker pods only on nodes with this label (repeatable; GPUs per node are "
        "discovered among those nodes)",
    )
    tolerations: tuple[str, ...] = option(
        (),
        flag="--toleration",
        action="append",
        metavar="KEY[=VALUE]:EFFECT",
        detached=SUBMITTING,
        help="let the worker pods onto nodes with this taint, e.g. nvidia.com/gpu:NoSchedule "
        "(repeatable; without =VALUE any value of KEY)",
    )
    priority_class: str | None = option(
        flag="--priority-class",
        metavar="NAME",
        detached=SUBMITTING,
        help="the PriorityClass of the job's pods (default: the cluster's default priority)",
    )
    queue: str | None = option(
        flag="--queue",
        metavar="NAME",
        detached=SUBMITTING,
        help="a Kueue LocalQueue of the job's namespace, whose quota admits the worker pods "
        "together (they wait holding nothing; --start-timeout counts the wait)",
    )
    gang: str = option(
        "none",
        flag="--gang",
        detached=SUBMITTING,
        help="gang-schedule the job's pods, all or none: volcano (Volcano's scheduler and a "
        "scheduling.volcano.sh PodGroup) or coscheduling (scheduler-plugins' "
        "scheduler-plugins-scheduler and a scheduling.x-k8s.io PodGroup); default none",
    )
    # each worker pod's memory request = limit (a Kubernetes quantity)
    pod_memory: str | None = option(
        flag="--pod-memory",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="memory request and limit of each worker pod, e.g. 8Gi (default: none, the "
        "namespace's LimitRange decides); a rank past it is reported as killed by the "
        "out-of-memory killer",
    )
    pod_cpu: str | None = option(
        flag="--pod-cpu",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="CPU request and limit of each worker pod, e.g. 4 or 3500m",
    )
    transport: str = option(
        "auto",
        flag="--transport",
        choices=TRANSPORTS,
        detached=RESOLVED,  # agent or exec, in the description's cluster["transport"]
        help="how mpirun's daemons reach the worker pods: agent (mpilaunch's exec agent is each "
        "pod's main process, reached over the pod network: no exec stream through the API "
        "server per daemon, no pods/exec permission), exec (the Kubernetes exec API), or "
        "auto (default: agent with --launcher cluster, exec with --launcher local, whose "
        "machine is usually outside the pod network)",
    )
    # shared clusters: an admin-made identity, PodSecurity, quotas, NetworkPolicies, service meshes
    # (security.py, rbac.py, resources.py, network_policy.py)
    service_account: str | None = option(
        flag="--service-account",
        metavar="NAME",
        detached=SUBMITTING,
        help="run the launcher and reaper as this ServiceAccount, made once by an admin "
        "(mpilaunch rbac --namespace NS | kubectl apply -f -): the job then creates no "
        "ServiceAccount, Role or RoleBinding, so the built-in 'edit' role is enough",
    )
    run_as_user: str = option(
        DEFAULT_RUN_AS,
        flag="--run-as-user",
        metavar="UID[:GID]|image|root",
        detached=SUBMITTING,
        help="the UID (and GID) of every container of the job (default %(default)s, PodSecurity "
        "'restricted'); image: the image's or the platform's own user (OpenShift); root: "
        "UID 0, refused where 'restricted' is enforced",
    )
    read_only_root: bool = option(
        False,
        flag="--read-only-root",
        detached=SUBMITTING,
        help="readOnlyRootFilesystem on every container (a writable emptyDir is at /tmp, which is HOME and TMPDIR)",
    )
    launcher_cpu: str | None = option(
        flag="--launcher-cpu",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="the launcher's CPU request = limit (default 500m)",
    )
    launcher_memory: str | None = option(
        flag="--launcher-memory",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="the launcher's memory request = limit (default: 256Mi + 12Mi per worker, rounded "
        "up to 64Mi: one shim per worker with direct spawn)",
    )
    reaper_cpu: str | None = option(
        flag="--reaper-cpu",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="the reaper's CPU request = limit (default 50m)",
    )
    reaper_memory: str | None = option(
        flag="--reaper-memory",
        metavar="QUANTITY",
        detached=SUBMITTING,
        help="the reaper's memory request = limit (default 128Mi)",
    )
    launcher_node_selector: tuple[tuple[str, str], ...] | None = option(  # None: unpinned
        flag="--launcher-node-selector",
        action="append",
        type=key_value,
        metavar="K=V",
        detached=SUBMITTING,
        help="where the launcher and reaper go (default: anywhere the scheduler puts "
        "them; the workers' --node-selector is not theirs: they use no GPU)",
    )
    launcher_tolerations: tuple[str, ...] | None = option(
        flag="--launcher-toleration",
        action="append",
        metavar="KEY[=VALUE]:EFFECT",
        detached=SUBMITTING,
        help="the launcher's and reaper's tolerations (default: none; the workers' are not theirs)",
    )
    network_policy: str = option(
        "job",
        flag="--network-policy",
        choices=NETWORK_POLICIES,
        detached=SUBMITTING,
        help="job (default): the job's pods accept connections only from each other (and "
        "the submitting machine with --launcher local); their egress is left as the "
        "namespace has it, with the job's own traffic (its pods, DNS, the API server for "
        "the launcher and reaper) added where the namespace's policies deny egress; "
        "strict: the job's pods also reach nothing but that traffic; none: create no "
        "policy (where policies are the admin's alone)",
    )
    mesh_injection: bool = option(
        False,
        flag="--mesh-injection",
        detached=SUBMITTING,
        help="keep a service mesh's sidecar injection (Istio, linkerd); by default the job's "
        "pods opt out: a sidecar keeps a launcher Job from completing (not with "
        "--network-policy strict: the proxies must reach their control plane)",
    )
    # a file of Pod / PodTemplate documents (pod_template.py), read by the backend
    pod_template: str | None = option(
        flag="--pod-template",
        metavar="FILE",
        detached=SUBMITTING,
        help="a Pod, PodTemplate or pod template spec (YAML) merged into the job's pods: "
        "imagePullSecrets, affinity, labels, annotations, securityContext, volumes, env "
        "from Secrets, sidecars, ...; a document labelled mpilaunch/role: worker or "
        "launcher is for that role only; a field mpilaunch owns (the main container's command, "
        "image, the agent port, restartPolicy, hostname) is refused",
    )
    # the device plugin's extended resource the workers ask for
    gpu_resource: str = option(
        DEFAULT_GPU_RESOURCE,
        flag="--gpu-resource",
        metavar="NAME",
        detached=SUBMITTING,
        help="the extended resource a worker's GPUs are, as its device plugin names it: "
        "%(default)s (default), amd.com/gpu, gpu.intel.com/i915, ...",
    )

    def __post_init__(self):
        if self.gang in GANG_ALIASES:
            object.__setattr__(self, "gang", GANG_ALIASES[self.gang])
        if self.queue is not None and not QUEUE_RE.fullmatch(self.queue):
            raise UsageError(
                f"invalid --queue {self.queue!r}",
                "the name of a Kueue LocalQueue in the job's namespace: lowercase letters, digits, "
                "'-' and '.', at most 63 characters (kubectl get localqueues lists them)",
            )
        if self.gang not in GANGS:
            raise UsageError(f"unknown --gang {self.gang!r}", f"choose one of: {', '.join(GANGS)}")
        for flag, value, example in (
            ("--pod-memory", self.pod_memory, "8Gi"),
            ("--pod-cpu", self.pod_cpu, "4"),
            ("--launcher-memory", self.launcher_memory, "2Gi"),
            ("--launcher-cpu", self.launcher_cpu, "1"),
            ("--reaper-memory", self.reaper_memory, "128Mi"),
            ("--reaper-cpu", self.reaper_cpu, "50m"),
        ):
            if value is not None and not QUANTITY_RE.fullmatch(value):
                raise UsageError(
                    f"{flag} {value!r} is not a Kubernetes quantity",
                    f"e.g. {flag} {example} (units: Ki Mi Gi Ti, k M G T, m for milli-CPUs)",
                )
        if self.transport not in TRANSPORTS:
            raise UsageError(f"unknown --transport {self.transport!r}", f"choose one of: {', '.join(TRANSPORTS)}")
        check_namespace(self.namespace)
        if self.service_account is not None and not NAME_RE.fullmatch(self.service_account):
            raise UsageError(
                f"invalid --service-account {self.service_account!r}",
                "the name of a ServiceAccount in the job's namespace, e.g. --service-account mpilaunch "
                "(made once by an admin: mpilaunch rbac --namespace NS | kubectl apply -f -)",
            )
        if self.network_policy not in NETWORK_POLICIES:
            raise UsageError(
                f"unknown --network-policy {self.network_policy!r}", f"choose one of: {', '.join(NETWORK_POLICIES)}"
            )
        if self.mesh_injection and self.network_policy == "strict":
            # a kept mesh's proxies dial their control plane (istiod, linkerd's destination and
            # identity) outside the job: strict would leave every pod waiting for its proxy
            raise UsageError(
                "--mesh-injection with --network-policy strict: the mesh's proxies could not reach their control plane",
                "use the default --network-policy job (it leaves the pods' egress as the namespace has it) "
                "or --network-policy none",
            )
        parse_run_as(self.run_as_user)  # UsageError now, not at render time
        check_gpu_resource(self.gpu_resource)

    @classmethod
    def add_manage_arguments(cls, parser) -> None:
        declared.add_arguments(cls, parser, only=CLUSTER_FIELDS)

    @classmethod
    def check_manage_arguments(cls, args) -> None:
        check_namespace(args.namespace)

    @classmethod
    def discover_gpus_per_node(cls, spec) -> int | None:
        """Largest ``--gpu-resource`` (``nvidia.com/gpu``) allocatable among the nodes the job may use."""
        return cls.discover_gpus(spec).per_node

    @classmethod
    def discover_gpus(cls, spec):
        """The nodes the job may use (--node-selector), listed once: the most ``--gpu-resource`` of
        one and their total. A list refused (403: a tenant's role rarely reads nodes) or failed is
        said in one warning line with the default it leads to; it was once silent."""
        from ...core.gpu_slots import GpuDiscovery
        from .api import Api, ApiError, resolve

        opts = spec.backend_options or cls()
        try:
            creds = resolve(opts.kubeconfig, opts.context, opts.namespace, None)
        except (UsageError, OSError, ValueError):  # no usable credentials: the backend says so itself, with its hint
            return GpuDiscovery()
        selector = ",".join(f"{k}={v}" for k, v in opts.node_selector) or None
        try:
            nodes = Api(creds, timeout=15).get("v1", "nodes", namespace=None, labelSelector=selector)["items"]
        except ApiError as e:
            why = f"cannot list the cluster's nodes to count their {opts.gpu_resource} ({e.status} {e.reason}"
            return GpuDiscovery(unknown_why=why + (": your role may not read nodes)" if e.status == 403 else ")"))
        except (OSError, ValueError) as e:
            return GpuDiscovery(unknown_why=f"cannot list the cluster's nodes to count their {opts.gpu_resource} ({e})")
        counts = [node_gpus(node, opts.gpu_resource) for node in nodes]
        return GpuDiscovery(
            per_node=max(counts, default=0) or None,
            total=sum(counts),
            nodes=len(nodes),
            resource=opts.gpu_resource,
            where=f" with --node-selector {selector}" if selector else "",
        )


def node_gpus(node: dict, resource: str) -> int:
    """A node's allocatable ``resource`` (0 where it has none or an unreadable count)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0
