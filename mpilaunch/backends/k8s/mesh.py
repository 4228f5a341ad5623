"""A service mesh's sidecar in a Job's pod (``--mesh-injection``): asked to quit once the pod's
own work is done. A Job's pod completes only when every container has ended, and a mesh's proxy
runs on after the main container exits: a detached job's launcher Job, and its reaper's, would
never complete.

Standard library only: the launcher and the reaper call it in their pods.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable

from ...core import env_names

#: set in the launcher's and the reaper's pods when the mesh's injection is kept
#: each mesh's endpoint on the pod's loopback that ends its proxy (POST)
QUIT_ENDPOINTS = (
    ("istio", "http://127.0.0.1:15020/quitquitquit"),  # pilot-agent
    ("linkerd", "http://127.0.0.1:4191/shutdown"),  # linkerd-proxy's admin server, with the annotation below
)
#: linkerd's proxy takes /shutdown only where the pod asks for it (off by default since 2.15)
LINKERD_SHUTDOWN = {"config.linkerd.io/proxy-admin-shutdown": "enabled"}


def job_pod_env(keep_injection: bool) -> list[dict]:
    """The launcher's and the reaper's pods: where a mesh's sidecar may be injected, they ask it to quit."""
    return [{"name": env_names.MESH_SIDECARS, "value": "1"}] if keep_injection else []


def quit_sidecars(endpoints=QUIT_ENDPOINTS, timeout: float = 2.0) -> list[str]:
    """POST to each mesh's quit endpoint; the names of the meshes whose proxy took it."""
    # no proxy from the environment: an HTTP_PROXY the image carries must not see the pod's loopback
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answered = []
    for name, url in endpoints:
        try:
            with opener.open(urllib.request.Request(url, data=b"", method="POST"), timeout=timeout) as reply:
                if 200 <= reply.status < 300:
                    answered.append(name)
        except OSError:  # no such proxy in this pod (refused), it refused the request, or it did not answer
            continue
    return answered


def quit_if_injected(log: Callable[[str], None], environ=os.environ) -> None:
    """At the end of a Job's pod: its mesh sidecar, if the job kept injection, is asked to quit."""
    if environ.get(env_names.MESH_SIDECARS) != "1":
        return
    answered = quit_sidecars()
    log(
        f"asked the mesh's sidecar to quit ({', '.join(answered)})"
        if answered
        else "no mesh sidecar answered on its quit endpoint (Istio 127.0.0.1:15020, linkerd 127.0.0.1:4191)"
    )
