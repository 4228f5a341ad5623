"""What became of a YARN job's worker containers: lost workers and the tf-yarn style failure report.

The YARN backend asks these after a run: which containers ended under the
job (killed by the NodeManager, preempted, failed) or stopped answering,
and the table of every container printed below a failed job's summary.
The verdicts are pure functions of the container facts the backend keeps
(``backend.containers``: state, container id, node, exit message).
"""

from __future__ import annotations

import time

from ..agent_workers import gone_agents, silent_agents

ENDED = ("FAILED", "KILLED", "SUCCEEDED")
# A worker whose agent died ends mpirun before the ApplicationMaster hears
# that its container ended; give YARN this long to say so.
SETTLE_S = 15.0


def container_loss(facts: dict, silent: bool, gone: bool = False) -> str | None:
    """Why a worker container no longer serves, in YARN's words where it has them; None while it does."""
    state = facts.get("state")
    if state in ENDED:
        exit_message = facts.get("exit")
        return f"container {state.lower()}" + (f": {exit_message}" if exit_message else "")
    if gone:
        return "its agent is gone (nothing listens at its address any more)"
    if silent:
        return "agent connection lost (its container is still RUNNING)"
    return None


def settle_containers(backend, names: set[str], seconds: float) -> None:
    """Refresh the containers until none of ``names`` shows RUNNING, for ``seconds`` at most."""
    deadline = time.monotonic() + (seconds if names else 0.0)
    while backend.refresh_containers() is not None:
        if all(backend.containers.get(n, {}).get("state") != "RUNNING" for n in names):
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)


def lost_workers(backend, settle: bool) -> dict[str, str]:
    """Worker containers that ended (or, with ``settle``, whose agents went silent).

    A silent agent's container is given SETTLE_S to be seen ended, for YARN's own word on it; one
    where nothing listens any more (its agent's process is gone) is lost at once: YARN reports
    the container's end 2-3 s later (the container's sweep, the NodeManager's heartbeat, the
    ApplicationMaster's), and a spare or a relaunch waited with it. The failed job's report waits
    for that word instead (``failure_report``)."""
    if backend.app is None:
        return {}
    silent, gone = set(), set()
    if settle:
        silent = backend.silent = silent_agents(backend.addresses, backend.secret_file)
        gone = gone_agents({name: backend.addresses[name] for name in silent})
    settle_containers(backend, silent - gone, SETTLE_S)
    lost = {}
    for w in backend.plan.workers:
        reason = container_loss(backend.containers.get(w.name, {}), w.name in silent, w.name in gone)
        if reason is not None:
            lost[w.name] = reason
    return lost


def failure_report(backend) -> str:
    """Every container of the application (host, state, exit status) under a failed job's summary;
    where an agent is gone, once YARN has seen its container end (SETTLE_S at most)."""
    silent = backend.silent if backend.silent is not None else silent_agents(backend.addresses, backend.secret_file)
    settle_containers(
        backend, gone_agents({n: backend.addresses[n] for n in silent if n in backend.addresses}), SETTLE_S
    )
    lines = [f"YARN application {backend.app_id} (queue {backend.opts.queue or 'default'}), worker containers:"]
    for w in backend.plan.workers:
        lines.append(_container_line(w.name, backend.containers.get(w.name, {}), w.name in silent))
    if backend.launcher_container:
        lines.append(_container_line(f"{backend.plan.job_name}-launcher", backend.launcher_container, False))
    return "\n".join(lines)


def _container_line(name: str, facts: dict, silent: bool) -> str:
    state = facts.get("state", "unknown")
    if state == "RUNNING" and silent:
        state = "RUNNING (agent not answering)"
    line = f"  {name}  {facts.get('container') or '-'}  on {facts.get('node') or '-'}  {state}"
    if facts.get("exit"):
        line += f"  exit: {facts['exit']}"
    return line
