"""What became of a YARN job's worker containers: lost workers and the tf-yarn style failure report.

The YARN backend asks these after a run: which containers ended under the
job (killed by the NodeManager, preempted, failed) or stopped answering,
and the table of every container printed below a failed job's summary.
The verdicts are pure functions of the container facts the backend keeps
(``backend.containers``: state, container id, node, exit message).
"""

from __future__ import annotations

import time

from ..agent_workers import silent_agents

ENDED = ("FAILED", "KILLED", "SUCCEEDED")
# A worker whose agent died ends mpirun before the ApplicationMaster hears
# that its container ended; give YARN this long to say so.
SETTLE_S = 15.0


def container_loss(facts: dict, silent: bool) -> str | None:
    """Why a worker container no longer serves, in YARN's words; None while it does."""
    state = facts.get("state")
    if state in ENDED:
        exit_message = facts.get("exit")
        return f"container {state.lower()}" + (f": {exit_message}" if exit_message else "")
    if silent:
        return "agent connection lost (its container is still RUNNING)"
    return None


def lost_workers(backend, settle: bool) -> dict[str, str]:
    """Worker containers that ended (or, with ``settle``, whose agents went silent)."""
    if backend.app is None:
        return {}
    silent = set()
    if settle:
        silent = backend.silent = silent_agents(backend.addresses, backend.secret_file)
    deadline = time.monotonic() + (SETTLE_S if silent else 0.0)
    while backend.refresh_containers() is not None:
        if all(backend.containers.get(n, {}).get("state") != "RUNNING" for n in silent):
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    lost = {}
    for w in backend.plan.workers:
        reason = container_loss(backend.containers.get(w.name, {}), w.name in silent)
        if reason is not None:
            lost[w.name] = reason
    return lost


def failure_report(backend) -> str:
    """Every container of the application (host, state, exit status) under a failed job's summary."""
    silent = backend.silent if backend.silent is not None else silent_agents(backend.addresses, backend.secret_file)
    backend.refresh_containers()
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
