"""What every part of the Kubernetes testbed shares: its error, its cache directory."""

from __future__ import annotations

import os
from pathlib import Path


class ClusterError(RuntimeError):
    pass


def cache_dir() -> Path:
    root = Path(os.environ.get("MPILAUNCH_CACHE", Path.home() / ".cache"))
    return Path(os.environ.get("MPILAUNCH_K8S_CACHE", root / "mpilaunch-k8s"))
