"""The Kubernetes backend's options: the image, where the pods go, what they may use."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from ...errors import UsageError
from ..base import BackendOptions

# A Kubernetes resource quantity: 512Mi, 8Gi, 1.5G, 500m, 4.
QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
# A Kubernetes namespace: a DNS-1123 label (part of API paths and of rendered YAML).
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NAMESPACE_HINT = ("a namespace is a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters, "
                  "starting and ending with a letter or digit, e.g. --namespace ml-team")
GANGS = ("none", "volcano", "coscheduling")
GANG_ALIASES = {"scheduler-plugins": "coscheduling"}  # its name before scheduler-plugins' plugin was meant
# A Kueue LocalQueue's name: a DNS-1123 subdomain (a label value too, so at most 63 characters).
QUEUE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
TRANSPORTS = ("auto", "agent", "exec")  # launch.resolve_transport says what auto is


def check_namespace(namespace: str | None) -> None:
    if namespace is not None and not NAMESPACE_RE.fullmatch(namespace):  # fullmatch: not before a trailing newline
        raise UsageError(f"invalid --namespace {namespace!r}", NAMESPACE_HINT)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def add_cluster_arguments(parser) -> None:
    """Which cluster and namespace: for a run and for status/logs/delete/wait alike."""
    parser.add_argument("--namespace", help="the namespace of the job's objects (default: the kubeconfig's)")
    parser.add_argument("--context", help="the kubeconfig context (default: its current one)")
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")


@dataclass(frozen=True)
class K8sOptions(BackendOptions):
    backend_class = "mpilaunch.backends.k8s.backend:K8sBackend"
    extra = "k8s"

    image: str | None = None
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    priority_class: str | None = None
    gang: str = "none"
    pod_memory: str | None = None  # each worker pod's memory request = limit (a Kubernetes quantity)
    pod_cpu: str | None = None  # ... and CPU request = limit
    transport: str = "auto"
    queue: str | None = None  # a Kueue LocalQueue in the job's namespace: the pods are admitted as one group

    def __post_init__(self):
        if self.gang in GANG_ALIASES:
            object.__setattr__(self, "gang", GANG_ALIASES[self.gang])
        if self.queue is not None and not QUEUE_RE.fullmatch(self.queue):
            raise UsageError(f"invalid --queue {self.queue!r}",
                             "the name of a Kueue LocalQueue in the job's namespace: lowercase letters, digits, "
                             "'-' and '.', at most 63 characters (kubectl get localqueues lists them)")
        if self.gang not in GANGS:
            raise UsageError(f"unknown --gang {self.gang!r}", f"choose one of: {', '.join(GANGS)}")
        for option, value, example in (("--pod-memory", self.pod_memory, "8Gi"), ("--pod-cpu", self.pod_cpu, "4")):
            if value is not None and not QUANTITY_RE.fullmatch(value):
                raise UsageError(f"{option} {value!r} is not a Kubernetes quantity",
                                 f"e.g. {option} {example} (units: Ki Mi Gi Ti, k M G T, m for milli-CPUs)")
        if self.transport not in TRANSPORTS:
            raise UsageError(f"unknown --transport {self.transport!r}", f"choose one of: {', '.join(TRANSPORTS)}")
        check_namespace(self.namespace)

    @classmethod
    def add_arguments(cls, group) -> None:
        group.add_argument("--image", help="the worker and launcher image (any image with an MPI; see README)")
        add_cluster_arguments(group)
        group.add_argument("--node-selector", action="append", default=[], type=key_value, metavar="K=V")
        group.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT")
        group.add_argument("--priority-class")
        group.add_argument("--gang", default="none",
                           help="gang-schedule the job's pods, all or none: volcano (Volcano's scheduler and a "
                                "scheduling.volcano.sh PodGroup) or coscheduling (scheduler-plugins' "
                                "scheduler-plugins-scheduler and a scheduling.x-k8s.io PodGroup); default none")
        group.add_argument("--pod-memory", metavar="QUANTITY",
                           help="memory request and limit of each worker pod, e.g. 8Gi (default: none, the "
                                "namespace's LimitRange decides); a rank past it is reported as killed by the "
                                "out-of-memory killer")
        group.add_argument("--pod-cpu", metavar="QUANTITY",
                           help="CPU request and limit of each worker pod, e.g. 4 or 3500m")
        group.add_argument("--transport", default="auto", choices=TRANSPORTS,
                           help="how mpirun's daemons reach the worker pods: agent (mpilaunch's exec agent is each "
                                "pod's main process, reached over the pod network: no exec stream through the API "
                                "server per daemon, no pods/exec permission), exec (the Kubernetes exec API), or "
                                "auto (default: agent with --launcher cluster, exec with --launcher local, whose "
                                "machine is usually outside the pod network)")

    @classmethod
    def from_args(cls, args) -> "K8sOptions":
        return cls(image=args.image, namespace=args.namespace, context=args.context, kubeconfig=args.kubeconfig,
                   node_selector=tuple(args.node_selector), tolerations=tuple(args.toleration),
                   priority_class=args.priority_class, gang=args.gang, pod_memory=args.pod_memory,
                   pod_cpu=args.pod_cpu, transport=args.transport, queue=args.queue)

    @classmethod
    def add_manage_arguments(cls, parser) -> None:
        add_cluster_arguments(parser)

    @classmethod
    def check_manage_arguments(cls, args) -> None:
        check_namespace(args.namespace)
