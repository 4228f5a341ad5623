"""Where a cluster keeps what mpilaunch finds about a job: a backend's collaborator, not its contract.

The hang diagnosis (``workloads/hang_watch.py``) and the preflight
(``workloads/preflight_run.py``) post there what they found, beside the line
on the terminal: Kubernetes keeps it as Warning Events, where ``kubectl
describe`` and ``kubectl get events`` show them (``k8s/hang_event.py``:
``PodEvents``, and the in-cluster launcher's ``LauncherEvents``). A backend
with such a place sets ``BaseBackend.cluster_notes`` to one; the others leave
it None, and the findings stay on the terminal and in the record.

Standard library only: the in-cluster launcher imports it in the job's image.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class ClusterNotes(ABC):
    """One backend's place for findings; each method returns True where it put the line, False where
    another side posts it, and raises what posting raised."""

    @abstractmethod
    def hang(self, verdict: str) -> bool:
        """The ``mpilaunch: hang:`` verdict, where the cluster's users look."""

    @abstractmethod
    def on_worker(self, worker: str, reason: str, text: str) -> bool:
        """A line about one worker (a failed preflight check), on that worker."""


def post_hang(backend, verdict: str) -> bool:
    """``verdict`` in the backend's cluster notes; False where it has none."""
    notes = backend.cluster_notes
    return notes is not None and notes.hang(verdict)


def post_on_worker(backend, worker: str, reason: str, text: str) -> bool:
    """``text`` about ``worker`` in the backend's cluster notes; False where it has none."""
    notes = backend.cluster_notes
    return notes is not None and notes.on_worker(worker, reason, text)
