"""What the backends whose workers run ``mpilaunch agent`` share (local, ssh, YARN; k8s's agent transport).

The job's agent credential (one file, readable by its owner only; the shims
and agents read it by path; a MAC secret and the job's TLS certificate and
key, ``agent_credential.py``), the launch's environment their daemons get where
the workers run this machine's software, and how an agent's process ended.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ..core import env_names
from .agent_credential import new_credential

# What the daemons need from the launcher's environment to find the same MPI
# and Python: this machine's, on workers that share its software (the local
# backend's processes; ssh hosts on a shared filesystem, the HPC norm).
FORWARD_ENV = (
    "PATH",
    env_names.WORKER_PATH,
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "OPAL_PREFIX",
    "PRTE_PREFIX",
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
)


def write_secret(path: Path, secret: str | None = None) -> None:
    """A new file, its owner's alone, holding ``secret`` (default: a new credential of the job's own)."""
    secret = secret or new_credential()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)


def how_it_ended(returncode: int) -> str:
    """A process's end as a report says it: ``exited with code 1``, ``was killed by SIGKILL``."""
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def silent_agents(addresses: dict[str, str], secret_file, timeout: float = 2.0) -> set[str]:
    """Workers whose agent does not answer an authenticated ping: asked only once a job failed
    (a ping to a busy machine can be slow, and a slow answer alone never makes a worker lost)."""
    from ..rsh_agent.agent_client import ping, read_secret

    secret = read_secret(str(secret_file))
    return {name for name, address in addresses.items() if not ping(address, secret, timeout)}


def gone_agents(addresses: dict[str, str]) -> set[str]:
    """Workers where nothing listens at their agent's address any more (its process ended): asked of
    the silent ones, a refused connection being an answer, unlike a slow one."""
    from ..rsh_agent.agent_client import gone

    return {name for name, address in addresses.items() if gone(address)}
