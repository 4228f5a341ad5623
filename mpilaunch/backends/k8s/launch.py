"""What the launcher pod of a Kubernetes job is told, and where each part is kept.

``launch_description``: a ``LaunchDescription``; the root ConfigMap's
launch.json holds it without its secrets (readable with the built-in
``view`` role: names and plan only). ``secret_values``: the values of the
forwarded variables and the status token, in the job's Secret (mounted
into the launcher pod, deleted with the job). Plus the
small helpers the manifests use.
"""

from __future__ import annotations

import os

from ...core import env_names, mpi
from ...core.errors import AllocationError, UsageError
from ...core.mpi import versions as mpi_versions
from ..launch_description import LaunchDescription, LaunchWorker, carried_spec
from .pods import WORKER_CONTAINER

# What --mpi auto is taken to be before the launcher pod detects the image's MPI itself.
ASSUMED_IMAGE_MPI = "openmpi"
# the shim's transport for this backend's contexts (the exec API), by module name
TRANSPORT = "mpilaunch.backends.k8s.exec_path.transport"

# Where the launcher pod finds the job's Secret (a volume: no RBAC on Secrets for the launcher).
SECRET_DIR = "/etc/mpilaunch-secret"
SECRET_KEY = "launch.json"

# --transport (options.TRANSPORTS): how mpirun's daemons get into the worker pods.
#   agent: each worker pod's main process is mpilaunch's exec agent, listening on the pod IP,
#          reached over the pod network (no exec stream through kube-apiserver per daemon);
#   exec:  the Kubernetes exec API (pods sleep; every daemon holds one exec stream for the job);
#   auto:  agent with the cluster launcher; exec with --launcher local, whose machine is
#          usually outside the pod network (pod IPs do not route there; the API server does).
AGENT_PORT = 7355
# The agent secret, a Secret volume in every pod of the job that runs or reaches an agent.
AGENT_SECRET_DIR = "/etc/mpilaunch-agent"
AGENT_SECRET_KEY = "secret"
# How long a shim tries a refused connection again: a pod is Ready once its container
# started, a moment (an interpreter start) before its agent listens.
AGENT_REFUSED_WAIT_S = 30.0
# The cluster's DNS domain (kubelet --cluster-domain); almost always this.
CLUSTER_DOMAIN = os.environ.get(env_names.K8S_CLUSTER_DOMAIN, "cluster.local")


def secret_name(job: str) -> str:
    return f"{job}-env"


def launcher_job_name(job: str) -> str:
    return f"{job}-launcher"


def agent_secret_name(job: str) -> str:
    return f"{job}-agent"


def job_secret_names(job: str, transport: str) -> list[str]:
    """The Secrets of a job with a cluster launcher: what a detached job's launcher or reaper deletes
    once the outcome is recorded (the forwarded values, the agents' private key)."""
    return [secret_name(job)] + ([agent_secret_name(job)] if transport == "agent" else [])


def resolve_transport(choice: str, placement) -> str:
    """--transport auto|agent|exec and where mpirun runs (a ``placement``) -> agent or exec."""
    return placement.default_transport if choice == "auto" else choice


def agent_address(pod_ip: str, port: int = AGENT_PORT) -> str:
    return f"[{pod_ip}]:{port}" if ":" in pod_ip else f"{pod_ip}:{port}"


def exec_api_context(creds: dict, workers, container: str = WORKER_CONTAINER) -> dict:
    """The shims' (and the hang probe's) context for the exec API: these credentials, each worker
    (a name) reached as the pod of its name."""
    return {"transport": TRANSPORT, **creds, "container": container, "workers": {w: {"pod": w} for w in workers}}


def agent_context(secret_file: str, pods: dict[str, dict | None], *, in_pod: bool) -> dict:
    """The shims' context for the agent transport: each worker pod's agent by its pod IP
    (``pods``: worker name -> its pod object as the API returned it).

    ``in_pod``: the secret is the launcher pod's Secret volume file (world-readable in a
    pod that is the job's alone), not the submitting side's own 0600 file.
    Nothing of the launcher's environment is forwarded: the pods have the image's.
    """
    pod_ips = {name: ((pod or {}).get("status") or {}).get("podIP") for name, pod in pods.items()}
    missing = sorted(name for name, ip in pod_ips.items() if not ip)
    if missing:
        raise AllocationError(
            f"worker pods without an IP: {', '.join(missing[:5])}",
            "the agent transport reaches pods by their IPs; check the pods' network "
            "(kubectl describe pod), or use --transport exec",
        )
    return {
        "transport": "agent",
        "secret_file": secret_file,
        "secret_shared_ok": in_pod,
        "forward_env": [],
        "refused_wait": AGENT_REFUSED_WAIT_S,
        "workers": {name: {"address": agent_address(ip)} for name, ip in pod_ips.items()},
    }


def templates():
    try:
        import jinja2
    except ImportError:
        raise UsageError("the k8s backend needs the Python package 'jinja2'", "pip install 'mpilaunch[k8s]'") from None
    try:
        # compiled templates kept between launches, beside the remembered MPI versions in the
        # user's cache (not TMPDIR: a job leaves nothing there), keyed by each template's source:
        # compiling them took 19 ms of every launch, loading 0.8 ms
        compiled = jinja2.FileSystemBytecodeCache(mpi_versions.cache_dir("templates"))
    except OSError:  # no writable cache: compile each time
        compiled = None
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("mpilaunch.backends.k8s", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=compiled,
    )
    environment.globals["env_names"] = env_names  # {{ env_names.WORKER }}: the names of core/env_names.py
    return environment


def parse_toleration(text: str) -> dict:
    """``KEY[=VALUE][:EFFECT]`` -> a toleration (``Exists`` without a value)."""
    body, _, effect = text.partition(":")
    key, eq, value = body.partition("=")
    if not key and not effect:
        raise UsageError(f"invalid --toleration {text!r}", "use KEY[=VALUE]:EFFECT, e.g. nvidia.com/gpu:NoSchedule")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise UsageError(f"invalid toleration effect {effect!r}", "use NoSchedule, PreferNoSchedule or NoExecute")
        tol["effect"] = effect
    return tol


def launch_description(
    spec,
    plan,
    job: str,
    namespace: str,
    rank_prefix: list[str],
    status_token: str | None,
    environ,
    transport: str = "exec",
    spares: tuple[str, ...] = (),
) -> LaunchDescription:
    """What the launcher pod needs to run mpirun. Its ConfigMap (launch.json) gets it without the
    secrets (``without_secrets``); the job's Secret gets those (``secret_values``). ``spares``: the
    spare pods the launcher may swap in itself (``--retries`` with ``--spares``: it relaunches
    mpirun then, up to --retries times)."""
    return LaunchDescription(
        job=job,
        workers=tuple(LaunchWorker(w.name, w.slots) for w in plan.workers),
        rank_prefix=tuple(rank_prefix),
        # detached, the launcher enforces --timeout itself (exit 124, as attached); the Job's
        # activeDeadlineSeconds, later by the start timeout and a margin, only backs it up.
        spec=carried_spec(spec),
        mpirun=spec.mpirun,  # with the cluster launcher, --mpirun names the image's mpirun
        env=forwarded_env(spec.env, environ),
        status_token=status_token,
        cluster={
            "namespace": namespace,
            "container": WORKER_CONTAINER,
            # the Secret's part, merged in by the launcher
            "secret_file": f"{SECRET_DIR}/{SECRET_KEY}",
            "transport": transport,
            "agent_secret_file": f"{AGENT_SECRET_DIR}/{AGENT_SECRET_KEY}",
            **({"spares": list(spares)} if spares else {}),
        },
        relaunches=spec.retries if spares else 0,
    )


def forwarded_env(user_env: tuple[str, ...], environ) -> tuple[str, ...]:
    """-x items with their values taken here (not in the launcher pod), then the variables every
    rank gets (mpi.FORWARDED_PREFIXES: NCCL_*, HOROVOD_*); not this machine's paths (PYTHONPATH):
    the image has its own."""
    env = []
    for item in user_env:
        name = item.split("=", 1)[0]
        if "=" not in item and name in environ:
            item = f"{name}={environ[name]}"
        env.append(item)
    for name, value in sorted(environ.items()):
        if name.startswith(mpi.FORWARDED_PREFIXES) and not any(e.split("=", 1)[0] == name for e in env):
            env.append(f"{name}={value}")
    return tuple(env)


def secret_values(description: LaunchDescription, reveal: bool = False) -> dict:
    """The launch description's part kept in the job's Secret, not in its ConfigMap;
    ``reveal``: the values themselves (only for creating it), else masked."""
    secrets = description.secrets()
    if not reveal:
        secrets["env"] = [
            (f"{n}={mpi.mask(v)}" if eq else n) for n, eq, v in (e.partition("=") for e in secrets["env"])
        ]
        secrets["status_token"] = mpi.mask(secrets["status_token"]) if secrets["status_token"] else None
    else:
        secrets["env"] = list(secrets["env"])
    return secrets


def image_mpi_info(spec) -> mpi.MpiInfo:
    """The image's MPI as far as this side can tell before the launcher pod detects it:
    --mpi's flavour, else what images usually bring (ASSUMED_IMAGE_MPI)."""
    flavour = ASSUMED_IMAGE_MPI if spec.mpi == "auto" else spec.mpi
    return mpi.MpiInfo(
        flavour=flavour, version="5 (the image's; detected in the launcher pod)", path=spec.mpirun or "mpirun"
    )
