"""The YARN backend's options: queue, node label, container size, the workers' Python."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import BackendOptions


@dataclass(frozen=True)
class YarnOptions(BackendOptions):
    backend_class = "mpilaunch.backends.yarn.backend:YarnBackend"
    extra = "yarn"

    queue: str | None = None
    node_label: str | None = None
    memory: str = "2 GiB"
    vcores: int = 1
    env_archive: str | None = None

    @classmethod
    def add_arguments(cls, group) -> None:
        group.add_argument("--queue", metavar="NAME", help="the YARN queue (default: the scheduler's)")
        group.add_argument("--node-label", help="run the containers on nodes with this label")
        group.add_argument("--memory", default="2 GiB", help="memory of each worker container (default 2 GiB)")
        group.add_argument("--vcores", type=int, default=1, help="vcores of each worker container (default 1)")
        group.add_argument(
            "--env-archive",
            metavar="PATH",
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
