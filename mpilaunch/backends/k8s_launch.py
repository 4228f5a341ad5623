"""What the launcher pod of a Kubernetes job is told, and where each part is kept.

``launch_spec``: the root ConfigMap's launch.json (readable with the
built-in ``view`` role: names and plan only). ``launch_secret``: the
values of the forwarded variables and the status token, in the job's
Secret (mounted into the launcher pod, deleted with the job). Plus the
small helpers the manifests use.
"""

from __future__ import annotations

import os

from .. import mpi
from ..errors import UsageError
from .k8s_pods import WORKER_CONTAINER

PYTHON_ENV = "MPILAUNCH_K8S_PYTHON"  # the workers' python (default python3)

# Where the launcher pod finds the job's Secret (a volume: no RBAC on Secrets for the launcher).
SECRET_DIR = "/etc/mpilaunch-secret"
SECRET_KEY = "launch.json"


def secret_name(job: str) -> str:
    return f"{job}-env"


def launcher_job_name(job: str) -> str:
    return f"{job}-launcher"


def templates():
    try:
        import jinja2
    except ImportError:
        raise UsageError("the k8s backend needs the Python package 'jinja2'", "pip install 'mpilaunch[k8s]'") from None
    return jinja2.Environment(
        loader=jinja2.PackageLoader("mpilaunch", "templates"),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )


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


def launch_spec(spec, plan, job: str, namespace: str, rank_prefix: list[str]) -> dict:
    """What the launcher pod needs to run mpirun (mounted as /etc/mpilaunch/launch.json); the
    values of the forwarded variables and the status token are in the job's Secret (``launch_secret``)."""
    return {
        "job": job,
        "namespace": namespace,
        "container": WORKER_CONTAINER,
        "workers": [[w.name, w.slots] for w in plan.workers],
        "mpi": spec.mpi,
        # with the cluster launcher, --mpirun names the image's mpirun
        "mpirun": spec.mpirun,
        "command": list(spec.command),
        "bind_gpus": spec.bind_gpus,
        "verify": spec.verify,
        "mpi_args": list(spec.mpi_args),
        "rank_prefix": list(rank_prefix),
        "start_timeout": spec.start_timeout,
        # detached, the launcher enforces --timeout itself (exit 124, as attached); the Job's
        # activeDeadlineSeconds, later by the start timeout and a margin, only backs it up.
        # Attached, the submitting side enforces it.
        "timeout": spec.timeout if spec.detach else None,
        "detach": spec.detach,
        # the Secret's launch.json, merged into this one by the launcher
        "secret_file": f"{SECRET_DIR}/{SECRET_KEY}",
    }


def launch_secret(spec, status_token: str | None, environ, reveal: bool = False) -> dict:
    """The launcher's part of the launch description kept in the job's Secret, not in its
    ConfigMap; ``reveal``: the values themselves (only for creating it), else masked."""
    env = []
    for item in spec.env:  # -x NAME takes its value here, not in the launcher pod
        name = item.split("=", 1)[0]
        if "=" not in item and name in environ:
            item = f"{name}={environ[name]}"
        env.append(item)
    for name, value in sorted(environ.items()):
        if name.startswith(("NCCL_", "HOROVOD_")) and not any(e.split("=", 1)[0] == name for e in env):
            env.append(f"{name}={value}")
    token = status_token
    if not reveal:
        env = [(f"{n}={mpi.mask(v)}" if eq else n) for n, eq, v in (e.partition("=") for e in env)]
        token = mpi.mask(token) if token else token
    # the rank wrappers' lines count only with the token, here and in the launcher (rank.py)
    return {"env": env, "status_token": token}
