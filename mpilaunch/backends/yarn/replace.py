"""--retries on YARN: a new container for each lost worker, in the same application.

The lost worker's container is killed if anything of it still runs, and
skein's ApplicationMaster adds one container to the worker service with
``MPILAUNCH_YARN_WORKER_NAME`` set, so the new container's agent serves
under the lost worker's name (container instance i is plan worker i
otherwise). The job secret goes back into the key-value store for the new
agent until ``wait_ready`` has seen it answer, as at the start; GPUs the
old container had claimed are given back first.
"""

from __future__ import annotations

import skein

from ...core import env_names
from .keys import GPU_KEY, KV_PREFIX, SERVICE, WORKER_KEY, WORKER_SECRET_KEY
from .report import ENDED


def replace_workers(backend, names: list[str]) -> None:
    from ...rsh_agent.agent_client import read_secret

    kv = backend.app.kv
    kv[KV_PREFIX + WORKER_SECRET_KEY] = read_secret(str(backend.secret_file))
    backend.refresh_containers()
    backend.silent = None
    for name in names:
        retire(backend, name)
        for facts in (backend.addresses, backend.workers_info, backend.ready_at):
            facts.pop(name, None)
        new = backend.app.add_container(SERVICE, env={env_names.YARN_WORKER_NAME: name})
        backend.replacements[new.instance] = name


def retire(backend, name: str) -> None:
    """The container that served worker ``name``: killed if anything of it still runs, its instance
    retired (``worker_of`` no longer calls it the worker), its GPU claims and registration dropped."""
    kv = backend.app.kv
    old = backend.containers.pop(name, {})
    if old.get("id") and old.get("state") not in ENDED:
        try:
            backend.app.kill_container(old["id"])
        except skein.exceptions.SkeinError:
            pass  # it ended meanwhile
    if old.get("instance") is not None:
        backend.retired.add(old["instance"])
    if old.get("container"):
        release_gpu_claims(kv, KV_PREFIX, old["container"])
    kv.discard(KV_PREFIX + WORKER_KEY + name)


def release_gpu_claims(kv, prefix: str, container_id: str) -> None:
    """The GPUs a container claimed by nvidia-smi (yarn_container.claim_gpus), free for its replacement."""
    for key, owner in kv.get_prefix(prefix + GPU_KEY).items():
        if owner == container_id.encode():
            kv.discard(key)
