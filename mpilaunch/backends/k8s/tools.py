"""Any image with an MPI on Kubernetes: mpilaunch's pieces come with the job, in a ConfigMap.

The job's containers run mpilaunch's rank wrapper (workers), its in-cluster
launcher and shim (the launcher pod) and its reaper. None of them needs
mpilaunch in the image: the job's ConfigMap ``<job>-tools`` holds the package
as a zip and small ``/bin/sh`` entry points (``image_tools.tools_files``),
and every pod of the job mounts it read-only at ``image_tools.TOOLS_DIR``;
each piece starts the image's ``python3 -IS`` with the zip on its path (the
user's program keeps its environment). So the pieces are always those of
the mpilaunch that submitted the job, need no registry and no init
container (which would cost a pod start the kubelet's 1 s status poll), and
the image needs only ``/bin/sh``, python3 and an MPI, which ``check-image``
verifies before anything runs: without them the container ends at once with
one line, which the backend reports (exit 3).

``MPILAUNCH_K8S_TOOLS=image``: the image's own mpilaunch runs instead
(``python3 -m ...``), as on kwok's pods, whose commands run on this machine.
"""

from __future__ import annotations

import base64
import functools
import os

from ...core import env_names
from ...runtime.image_tools import CHECK_EXIT, CHECK_MARK, TOOLS_DIR, ZIP_NAME, entry_point, tools_files

VOLUME = "mpilaunch-tools"
# the launch description in the launcher pod: the job Secret's volume (launch.SECRET_DIR)
LAUNCH_JSON = "/etc/mpilaunch-secret/description.json"
SLEEP = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
HINT = (
    "use an image with /bin/sh, python3 (3.8 or newer) and an MPI (mpirun or mpiexec on its PATH, or "
    "name it with --mpirun)"
)


def from_configmap(environ=os.environ) -> bool:
    """Whether the job's pods take mpilaunch's pieces from the job's ConfigMap (else: from the image)."""
    return environ.get(env_names.K8S_TOOLS, "configmap") != "image"


def configmap_name(job: str) -> str:
    return f"{job}-tools"


def rank_prefix(tools: bool, python: str) -> list[str]:
    return [entry_point("mpilaunch-rank")] if tools else [python, "-m", "mpilaunch.rank"]


def agent_argv(tools: bool) -> str:
    """The worker pod's exec agent (``--transport agent``), as a shell command line: its pod IP only
    (``$POD_IP``), the job's Secret volume, no private directories (a pod is a host of its own)."""
    from .launch import AGENT_PORT, AGENT_SECRET_DIR, AGENT_SECRET_KEY

    program = entry_point("mpilaunch-agent") if tools else "python3 -m mpilaunch.agent"
    return (
        f'{program} --name "${env_names.WORKER}" --listen "[$POD_IP]:{AGENT_PORT}" '
        f"--secret-file {AGENT_SECRET_DIR}/{AGENT_SECRET_KEY} --own-host"
    )


def worker_command(tools: bool, transport: str = "exec") -> list[str]:
    """exec transport: sleep until deleted (the trap makes deletion quick: PID 1 ignores SIGTERM
    otherwise); agent: become the agent (it ends its commands' sessions on SIGTERM and reaps
    orphans, as PID 1 must). First, with the job's pieces, check that the image can run them."""
    main = f"exec {agent_argv(tools)}" if transport == "agent" else SLEEP
    if not tools:
        return ["/bin/sh", "-c", main]
    return ["/bin/sh", "-c", f"{TOOLS_DIR}/check-image worker || exit {CHECK_EXIT}; {main}"]


def launcher_command(tools: bool, mpirun: str | None) -> list[str]:
    if not tools:
        return ["python3", "-m", "mpilaunch.backends.k8s.in_cluster.launcher", LAUNCH_JSON]
    script = (
        f'{TOOLS_DIR}/check-image launcher "$0" || exit {CHECK_EXIT}; '
        f"exec {entry_point('mpilaunch-launcher')} {LAUNCH_JSON}"
    )
    return ["/bin/sh", "-c", script, mpirun or ""]


def reaper_command(tools: bool, args: list[str]) -> list[str]:
    """``args``: the reaper's own (job, options)."""
    if not tools:
        return ["python3", "-m", "mpilaunch.backends.k8s.in_cluster.reaper", *args]
    return [entry_point("mpilaunch-reaper"), *args]


@functools.lru_cache(maxsize=1)
def _configmap_data() -> tuple[dict, dict]:
    files = tools_files()
    data = {name: content.decode() for name, content in files.items() if name != ZIP_NAME}
    return data, {ZIP_NAME: base64.b64encode(files[ZIP_NAME]).decode()}


def template_values(tools: bool, job: str) -> dict:
    """What the templates need: the ConfigMap's files, the volume, where it is mounted."""
    if not tools:
        return {"tools": None}
    data, binary = _configmap_data()
    return {"tools": {"name": configmap_name(job), "volume": VOLUME, "dir": TOOLS_DIR, "data": data, "binary": binary}}


def image_problem(message: str | None) -> str | None:
    """The check's finding (``the image X lacks ...``), when a container's termination message
    (or a line about it) holds one."""
    at = (message or "").find(CHECK_MARK)
    if at < 0:
        return None
    return message[at:].splitlines()[0].strip()[len("mpilaunch: ") :]


def termination_messages(pod: dict | None) -> str:
    """What the pod's containers said as they ended (``/dev/termination-log``)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or ()
    return "\n".join(((cs.get("state") or {}).get("terminated") or {}).get("message") or "" for cs in statuses)
