"""torch.distributed's MASTER_ADDR/MASTER_PORT on a cluster worker (``BaseBackend.rendezvous``).

A pod has a network namespace of its own: a fixed port is free there (as
torchrun's and Volcano's pytorch plugin's defaults are), and the worker's
``<hostname>.<subdomain>`` name resolves from every pod of the job. A YARN
container shares its NodeManager's network: a free port is asked for on
that host, through the worker's exec agent, once per launch.
"""

from __future__ import annotations

import shlex

from ..core.interpreter import CONTAINER_PYTHON, interpreter_word
from ..rsh_agent import agent_client

POD_PORT = 29500  # torchrun's default: free in a pod of the job's own


def free_port_below_ephemeral(host: str = "") -> int:
    """A port below the host's ephemeral range, free now: rank 0 binds it seconds later, and the
    kernel never hands such a port to another process's connect() or bind(0) in between (an
    ephemeral one it does, under load: "Address already in use" in rank 0). The ephemeral range
    only as a last resort. Self-contained: its source also runs on remote workers."""
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low = int(ports.read().split()[0])
    except (OSError, ValueError):
        low = 32768
    for port in random.sample(range(10000, low), min(200, max(low - 10000, 0))) + [0]:
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise OSError("no free port")


# what a worker's own python runs (it may not have mpilaunch installed)
def free_port_script() -> str:
    """``free_port_below_ephemeral`` as a script (made when asked: reading its source is ~7 ms of
    every launch's start, and only a job whose ranks rendezvous through an agent needs it)."""
    import inspect

    return inspect.getsource(free_port_below_ephemeral) + "\nprint(free_port_below_ephemeral())\n"


def pod_rendezvous(worker: str, job: str) -> tuple[str, int]:
    return f"{worker}.{job}", POD_PORT


def free_port_through_agent(address: str, secret_file: str, python: str) -> tuple[str, int] | None:
    """(the agent's host, a port free there) asked through the agent at ``address``; None if it
    cannot tell (the ranks then get no MASTER_ADDR/MASTER_PORT rather than a wrong one)."""
    try:
        command = f"exec {interpreter_word(python)} -c {shlex.quote(free_port_script())}"
        secret = agent_client.read_secret(secret_file)
        status, out, _ = agent_client.run_capture(address, secret, command, timeout=30)
    except (OSError, TimeoutError, ValueError):
        return None
    text = out.decode(errors="replace").strip()
    if status != 0 or not text.isdigit():
        return None
    return address.rpartition(":")[0], int(text)


def rank_python(rank_prefix: list[str]) -> str:
    """The python the ranks' wrapper runs with: its absolute path, or the container's own."""
    first = rank_prefix[0] if rank_prefix else ""
    return first if first.startswith("/") and "python" in first else CONTAINER_PYTHON


def source_address(peer_ip: str) -> str | None:
    """This machine's address on its route to ``peer_ip`` (what the peer sees connections come
    from, so an address it can reach); None without a route. A UDP connect sends nothing."""
    import socket

    family = socket.AF_INET6 if ":" in peer_ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((peer_ip, 9))
            return sock.getsockname()[0]
    except OSError:
        return None
