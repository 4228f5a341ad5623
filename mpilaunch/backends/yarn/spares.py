"""--spares on YARN: spare worker containers in the application, and a swap that waits for no scheduler.

The worker service is asked for K more instances than the plan's workers;
instance N+i calls itself ``<job>-spare-<i>`` (the service's
``MPILAUNCH_YARN_WORKER_NAMES`` lists the plan's names, then the spares'),
registers its agent in the key-value store like a worker and waits, outside
the hostfile. The job never waits for a spare: one that YARN does not place,
or whose agent is not up, is not used. A swap retires the replaced
container's instance and records the spare's instance as the worker's
(``backend.replacements``: ``worker_of`` then calls that container by the
worker's name, so the lost-worker watch and the report follow it), and asks
skein's ApplicationMaster for another spare container. The job secret stays
in the key-value store while a spare has not read it yet.

With the launcher container it swaps itself (``in_cluster/spare_swaps.py``):
its description carries --retries (``relaunches``) and says spares are kept
(``cluster["spares"]``); when a worker's agent is gone and a spare's answers,
it runs mpirun again from the same container and tells this side in a signed
line (``taken_by_launcher``). Without a spare answering it ends as before, and
the relaunch's new launcher container is given the spares' addresses under the
workers' names, ``cluster["serving"]`` naming the spares (``spare_pool.SPARE_KEY``).
"""

from __future__ import annotations

import json

import skein

from ...core import env_names
from ...core.errors import UsageError
from . import replace
from .keys import KV_PREFIX, SERVICE, WORKER_KEY, WORKER_SECRET_KEY
from .report import ENDED


def check(spec, launcher: str) -> None:
    """--spares where this backend cannot keep them: one line, exit 2, before anything is asked."""
    if spec.spares and launcher == "cluster" and not spec.retries:
        raise UsageError(
            "--spares with the launcher container serves --retries only (its preflight cannot swap a worker)",
            "add --retries N, or --launcher local for --preflight enforce to swap rejected workers",
        )


def register(backend, name: str, info: dict, answers: bool) -> None:
    """A spare's agent registered in the key-value store (wait_ready's and ``waiting``'s look)."""
    if answers and name not in backend.spare_addresses:
        backend.spare_addresses[name] = info["address"]
        backend.spare_info[name] = info
        backend.spares.ready(name)


def pending(backend) -> list[str]:
    """Spares asked for whose agent has not answered yet, and whose container has not ended."""
    return [
        name
        for name in backend.spare_names
        if name not in backend.spare_addresses
        and name not in backend.spares.serving.values()
        and backend.containers.get(name, {}).get("state") not in ENDED
    ]


def waiting(backend) -> int:
    """Look at the spares once: registered agents that answer wait; an ended container is no spare.
    The job secret leaves the key-value store once no spare still needs it."""
    from ...rsh_agent.agent_client import ping, read_secret

    if backend.app is None or not backend.spare_names:
        return 0
    try:
        registered = backend.app.kv.get_prefix(KV_PREFIX + WORKER_KEY)
    except (skein.exceptions.SkeinError, ConnectionError, OSError):
        return len(backend.spares.waiting)
    secret = read_secret(str(backend.secret_file))
    for key, value in registered.items():
        name = key[len(KV_PREFIX + WORKER_KEY) :]
        if name in backend.spare_names and name not in backend.spare_addresses:
            info = json.loads(value)
            register(backend, name, info, ping(info["address"], secret, timeout=2.0))
    backend.refresh_containers()
    for name in list(backend.spares.waiting):
        if backend.containers.get(name, {}).get("state") in ENDED:
            backend.spares.lost(name)
    if not pending(backend):
        backend.app.kv.discard(KV_PREFIX + WORKER_SECRET_KEY)
    return len(backend.spares.waiting)


def ask(backend, count: int) -> None:
    """``count`` more spare containers, each told its name (as a replacement is), the secret back
    in the key-value store for them."""
    from ...rsh_agent.agent_client import read_secret

    if not count:
        return
    backend.app.kv[KV_PREFIX + WORKER_SECRET_KEY] = read_secret(str(backend.secret_file))
    for _ in range(count):
        name = backend.spares.new_spare().name
        try:
            new = backend.app.add_container(SERVICE, env={env_names.YARN_WORKER_NAME: name})
        except skein.exceptions.SkeinError:
            continue  # the job goes on without it
        backend.replacements[new.instance] = name
        backend.spare_names.append(name)


def swap(backend, names: list[str], why: str, recreate) -> dict[str, str]:
    """A waiting spare container serves each of ``names`` (the container that served it killed, its
    instance retired), another spare asked for; ``recreate(names)`` for those no spare waits for."""
    waiting(backend)
    taken, rest = {}, []
    for name in names:
        spare = backend.spares.take(name, why)
        if spare is None:
            rest.append(name)
            continue
        serve(backend, name, spare)
        taken[name] = spare
    if rest:
        recreate(rest)
    ask(backend, len(taken))
    return taken


def serve(backend, worker: str, spare: str) -> None:
    """Spare container ``spare`` is worker ``worker``'s from now on; the one that served it retired."""
    replace.retire(backend, worker)
    facts = backend.containers.pop(spare, {})
    if facts.get("instance") is not None:
        backend.replacements[facts["instance"]] = worker
    backend.containers[worker] = facts
    if spare in backend.spare_addresses:
        backend.addresses[worker] = backend.spare_addresses.pop(spare)
    backend.workers_info[worker] = backend.spare_info.pop(spare, {})


def taken_by_launcher(backend, swaps: list[dict]) -> list[dict]:
    """The launcher container's own swaps (its signed line, ``launcher_lines.swap_line``), kept here
    too: the spare container serves the worker, the one that served it is retired, a new spare is
    asked for. A swap naming a worker not of the plan or a spare this side did not ask for, or one
    that already serves, is left out (a warning). Returns the swaps kept."""
    waiting(backend)  # the spares' registrations and containers, as this side sees them now
    workers, kept = {w.name for w in backend.plan.workers}, []
    for entry in swaps:
        worker, spare = entry["worker"], entry["spare"]
        if worker not in workers or spare not in backend.spare_names or spare in backend.spares.serving.values():
            print(
                f"mpilaunch: warning: the launcher container swapped {spare} for {worker}, not a spare of this job; ignored"
            )
            continue
        backend.spares.lost(spare)  # waits no more
        backend.spares.serving[worker] = spare
        serve(backend, worker, spare)
        kept.append(entry)
    ask(backend, len(kept))
    return kept
