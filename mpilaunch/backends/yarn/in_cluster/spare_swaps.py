"""--retries with --spares in the YARN launcher container: a lost worker's place swapped to a spare
container whose agent answers, and mpirun run again from the same launcher container.

The spares register their agents in the application's key-value store as the workers do
(``keys.WORKER_KEY`` + ``<job>-spare-<i>``); the launcher container reads those registrations,
pings each spare's agent with the job secret, and tells a worker's agent is gone by a refused
connection (``agent_client.gone``: its process ended). Without a spare answering the job ends
as before and the submitting side relaunches with a new launcher container.
"""

from __future__ import annotations

import json

from ..keys import WORKER_KEY


def spare_index(job: str, name: str) -> int | None:
    """i of ``<job>-spare-<i>`` (the order spares were asked for), None for any other name (pure)."""
    head = f"{job}-spare-"
    tail = name[len(head) :] if name.startswith(head) else ""
    return int(tail) if tail.isdigit() else None


def registered_spares(registrations: dict, prefix: str, job: str, serving: set) -> list[tuple[str, str]]:
    """(name, agent address) of each spare registered under ``prefix + WORKER_KEY`` and serving no
    worker, oldest first (pure: ``registrations`` is what ``kv.get_prefix`` gave)."""
    found = []
    for key, value in registrations.items():
        name = key[len(prefix + WORKER_KEY) :]
        index = spare_index(job, name)
        if index is None or name in serving:
            continue
        try:
            address = json.loads(value)["address"]
        except (ValueError, KeyError, TypeError):
            continue  # a registration half written or not ours: no spare
        found.append((index, name, str(address)))
    return [(name, address) for _, name, address in sorted(found)]


def waiting_spares(kv, prefix: str, job: str, serving: set, secret: bytes) -> list[tuple[str, str]]:
    """The registered spares whose agent answers an authenticated ping now."""
    from ....rsh_agent.agent_client import ping

    registrations = kv.get_prefix(prefix + WORKER_KEY)
    return [(n, a) for n, a in registered_spares(registrations, prefix, job, serving) if ping(a, secret, timeout=2.0)]


def gone_workers(addresses: dict[str, str]) -> dict[str, str]:
    """The workers whose agent's address refuses connections (its process ended), with why."""
    from ....rsh_agent.agent_client import gone

    return {name: "its agent is gone (connection refused)" for name, address in addresses.items() if gone(address)}
