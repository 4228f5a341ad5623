"""The YARN backend's options: queue, node label, container size, the workers' Python."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.declared import RESOLVED, SUBMITTING, option
from ..base import BackendOptions


@dataclass(frozen=True)
class YarnOptions(BackendOptions):
    backend_class = "mpilaunch.backends.yarn.backend:YarnBackend"
    extra = "yarn"

    # what each worker container is: asked of the ResourceManager before the hand-off
    queue: str | None = option(
        flag="--queue", metavar="NAME", detached=SUBMITTING, help="the YARN queue (default: the scheduler's)"
    )
    node_label: str | None = option(
        flag="--node-label", detached=SUBMITTING, help="run the containers on nodes with this label"
    )
    memory: str = option(
        "2 GiB", flag="--memory", detached=SUBMITTING, help="memory of each worker container (default 2 GiB)"
    )
    vcores: int = option(
        1, flag="--vcores", type=int, detached=SUBMITTING, help="vcores of each worker container (default 1)"
    )
    # the launcher's mpirun and environment come from the archive (the description's mpirun, cluster["environ"])
    env_archive: str | None = option(
        flag="--env-archive",
        metavar="PATH",
        detached=RESOLVED,
        help="a packed Python environment (conda-pack/venv-pack) the containers run in; "
        "mpilaunch's pieces come with the job",
    )

    @classmethod
    def discover_gpus_per_node(cls, spec) -> int | None:
        """The most GPUs of a running node with --node-label (without it: of an unlabelled node)."""
        from .client import skein_client

        client = skein_client()
        try:
            label = (spec.backend_options or cls()).node_label or ""
            counts = [
                n.total_resources.gpus
                for n in client.get_nodes(states=["RUNNING"])
                if label in (n.node_labels or set()) or (not label and not n.node_labels)
            ]
        except Exception:
            return None
        finally:
            client.close()
        return max(counts, default=0) or None
