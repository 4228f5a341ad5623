"""Any image with an MPI on Kubernetes: mpilaunch's pieces come from the tools image.

The job's containers run mpilaunch's rank wrapper (workers), its in-cluster
launcher and shim (the launcher pod). An image without mpilaunch gets them
from ``--tools-image`` (default: the mpilaunch image of this version, or
``$MPILAUNCH_TOOLS_IMAGE``): an init container of that image copies them into
an emptyDir (``python3 -m mpilaunch.image_tools copy``) that the job's own
container mounts read-only at ``image_tools.TOOLS_DIR``; each piece starts
the image's ``python3 -IS`` from there (the user's program keeps its
environment). The image is checked first (``bin/check-image``): without
python3 or an MPI its container ends at once with one line that the backend
reports (exit 3). The reaper pod, mpilaunch's alone, runs the tools image.

``--tools-image none``, or the tools image given as ``--image``: the image has
mpilaunch itself, and runs it as ``python3 -m`` (no init container).
"""

from __future__ import annotations

import os

from ..version import __version__
from ..image_tools import CHECK_EXIT, CHECK_MARK, TOOLS_DIR, entry_point

TOOLS_IMAGE_ENV = "MPILAUNCH_TOOLS_IMAGE"
DEFAULT_TOOLS_IMAGE = f"mpilaunch/mpilaunch:{__version__}"
NO_TOOLS = "none"
VOLUME = "mpilaunch-tools"
INIT_CONTAINER = "mpilaunch-tools"
LAUNCH_JSON = "/etc/mpilaunch/launch.json"
SLEEP = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
HINT = ("use an image with /bin/sh, python3 (3.8 or newer) and an MPI (mpirun or mpiexec on its PATH, or "
        "name it with --mpirun), or the mpilaunch image (scripts/build-image.sh)")


def tools_image(image: str | None, option: str | None, environ=os.environ) -> str | None:
    """The image mpilaunch's pieces come from, or None when ``image`` has them itself."""
    chosen = option or environ.get(TOOLS_IMAGE_ENV) or DEFAULT_TOOLS_IMAGE
    if chosen == NO_TOOLS or chosen == image:
        return None
    return chosen


def rank_prefix(tools: str | None, python: str) -> list[str]:
    return [entry_point("mpilaunch-rank")] if tools else [python, "-m", "mpilaunch.rank"]


def task_starter_prefix(tools: str | None, python: str) -> list[str]:
    return [entry_point("mpilaunch-task")] if tools else [python, "-m", "mpilaunch.task_starter"]


def worker_command(tools: str | None) -> list[str]:
    """Sleep until deleted (the trap makes deletion quick: PID 1 ignores SIGTERM otherwise); first,
    with tools, check that the image can run the rank wrapper."""
    if not tools:
        return ["/bin/sh", "-c", SLEEP]
    return ["/bin/sh", "-c", f"{TOOLS_DIR}/bin/check-image worker || exit {CHECK_EXIT}; {SLEEP}"]


def launcher_command(tools: str | None, mpirun: str | None) -> list[str]:
    if not tools:
        return ["python3", "-m", "mpilaunch.launchers.k8s", LAUNCH_JSON]
    script = (f'{TOOLS_DIR}/bin/check-image launcher "$0" || exit {CHECK_EXIT}; '
              f'exec {entry_point("mpilaunch-launcher")} {LAUNCH_JSON}')
    return ["/bin/sh", "-c", script, mpirun or ""]


def template_values(tools: str | None, image: str) -> dict:
    """What the templates need: the init container, its volume, the mount; the reaper's image."""
    if not tools:
        return {"tools": None, "reaper_image": image}
    return {
        "tools": {
            "image": tools,
            "volume": VOLUME,
            "dir": TOOLS_DIR,
            "init": {"name": INIT_CONTAINER, "image": tools, "imagePullPolicy": "IfNotPresent",
                     "command": ["python3", "-m", "mpilaunch.image_tools", "copy", TOOLS_DIR],
                     "volumeMounts": [{"name": VOLUME, "mountPath": TOOLS_DIR}]},
        },
        "reaper_image": tools,
    }


def image_problem(message: str | None) -> str | None:
    """The check's finding (``the image X lacks ...``), when a container's termination message
    (or a line about it) holds one."""
    at = (message or "").find(CHECK_MARK)
    if at < 0:
        return None
    return message[at:].splitlines()[0].strip()[len("mpilaunch: "):]


def termination_messages(pod: dict | None) -> str:
    """What the pod's containers said as they ended (``/dev/termination-log``)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or ()
    return "\n".join(((cs.get("state") or {}).get("terminated") or {}).get("message") or "" for cs in statuses)
