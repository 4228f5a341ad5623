"""Find a job whose mpilaunch runs on this machine by its name: its run directory's context file.

A job's mpilaunch (attached in another terminal, or in the background; any
backend) writes ``context.json`` into its run directory
(``rundir.make_rundir``: ``$TMPDIR/mpilaunch-<job>-*``) once its workers are
ready: how to reach each worker's exec agent, and the job's backend.

$TMPDIR is usually /tmp, where any local user may make a directory of that
name and a context in it that sends the probe, and whatever credentials it
names, to a server of theirs (issue 49). So a run directory counts only when
it is this user's own (``rundir.open_own_rundir``: mode 700, owned by us, no
link followed) and its owner process surely runs (``rundir.owner_alive``),
and of its context only what says which job and which workers is taken
(``stacks_context``): a transport of a fixed set, each worker's name and
address (or pod), the agent secret as the run directory's own file. Never a
server, TLS setting, CA, token or relay: the exec API's credentials are the
caller's own configuration's (``needs_credentials``: ``job.manage`` adds them).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile

from ..runtime.rundir import OWNER_FILE, open_own_rundir, owner_alive, read_own_file

AGENT = "agent"  # mpilaunch.rsh_agent.transports.agent: local, ssh, YARN, Kubernetes --transport agent
K8S_EXEC = "mpilaunch.backends.k8s.exec_path.transport"  # backends/k8s/launch.TRANSPORT: the exec API
#: the transports a context found by name may name (each one's module is imported to reach the workers)
STACKS_TRANSPORTS = (AGENT, K8S_EXEC)
CONTEXT_FILE = "context.json"


def running_contexts(
    job: str, backend: str | None = None, tmpdir: str | None = None, uid: int | None = None
) -> list[dict]:
    """What ``stacks_context`` takes of the context of every running local job named ``job`` (of
    ``backend``, where given; usually one) whose run directory is this user's own (``uid``)."""
    found = []
    base = os.path.abspath(tmpdir or tempfile.gettempdir())
    for rundir in sorted(glob.glob(os.path.join(glob.escape(base), f"mpilaunch-{glob.escape(job)}-*"))):
        try:
            fd = open_own_rundir(rundir, uid)
        except OSError:
            continue  # another user's, a link, not mode 700 (an agent's private TMPDIR is 700 too)
        try:
            owner = read_own_file(fd, OWNER_FILE, uid)
            context = json.loads(read_own_file(fd, CONTEXT_FILE, uid))
        except (OSError, ValueError):
            continue  # not a job's run directory (a worker's), or not ready yet
        finally:
            os.close(fd)
        taken = stacks_context(context, rundir)
        if taken is None or taken["job"] != job or (backend is not None and taken["backend"] != backend):
            continue
        if owner_alive(owner):
            found.append(taken)
    return found


def _text(value) -> bool:
    return isinstance(value, str) and bool(value) and "\0" not in value


def stacks_context(context, rundir: str) -> dict | None:
    """What ``mpilaunch stacks`` takes of a context file found in ``rundir`` (the caller's own); None
    for one that is not a job's, or whose transport is not in ``STACKS_TRANSPORTS``.

    Kept: the job, its backend, the transport, each worker's name and address (agent) or pod (exec
    API), the container and namespace, how the workers run Python (``probe_python``). The agent's
    secret is the run directory's own file of that name, wherever the context says it is. Left out:
    everything else (server, ``insecure``, CA, client certificate, token file, relay, forwarded
    variables)."""
    if not isinstance(context, dict):
        return None
    transport, workers = context.get("transport") or AGENT, context.get("workers")
    if transport not in STACKS_TRANSPORTS or not isinstance(workers, dict) or not workers:
        return None
    if not _text(context.get("job")) or not _text(context.get("backend")):
        return None
    taken = {"job": context["job"], "backend": context["backend"], "transport": transport}
    if _text(context.get("probe_python")):
        taken["probe_python"] = context["probe_python"]
    key = "address" if transport == AGENT else "pod"
    if not all(_text(name) and isinstance(w, dict) and _text(w.get(key)) for name, w in workers.items()):
        return None
    taken["workers"] = {name: {key: w[key]} for name, w in workers.items()}
    if transport == AGENT:
        secret = os.path.basename(context.get("secret_file") or "") if _text(context.get("secret_file")) else ""
        if secret in ("", ".", ".."):
            return None
        taken["secret_file"] = os.path.join(rundir, secret)
    else:
        for optional in ("container", "namespace"):
            if _text(context.get(optional)):
                taken[optional] = context[optional]
    return taken


def needs_credentials(context: dict) -> bool:
    """Whether a ``stacks_context`` reaches its workers with credentials the caller adds (the exec
    API: the user's own, from their configuration), not with its run directory's agent secret."""
    return context["transport"] != AGENT


def one_per_job(contexts) -> list[dict]:
    """One context per job: a YARN job's launcher container (``<job>-launcher``) that runs on this
    machine writes one too, naming the same workers."""
    seen, out = set(), []
    for context in contexts:
        workers = json.dumps(context.get("workers"), sort_keys=True)
        if workers not in seen:
            seen.add(workers)
            out.append(context)
    return out
