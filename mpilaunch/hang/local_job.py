"""Find a job whose mpilaunch runs on this machine by its name: its run directory's context file.

A job's mpilaunch (attached in another terminal, or in the background; any
backend) writes ``context.json`` into its run directory
(``rundir.make_rundir``: ``$TMPDIR/mpilaunch-<job>-*``) once its workers are
ready: how to reach each worker's exec agent, and the job's backend. Only a
directory whose owner process still runs counts.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile

from ..job.rundir import OWNER_FILE, owner_gone


def running_contexts(job: str, tmpdir: str | None = None) -> list[dict]:
    """The context of every running local job named ``job`` (usually one)."""
    found = []
    pattern = os.path.join(glob.escape(tmpdir or tempfile.gettempdir()), f"mpilaunch-{glob.escape(job)}-*")
    for rundir in sorted(glob.glob(pattern)):
        try:
            with open(os.path.join(rundir, "context.json")) as f:
                context = json.load(f)
            with open(os.path.join(rundir, OWNER_FILE)) as f:
                owner = f.read()
        except (OSError, ValueError):
            continue  # not a job's run directory (a worker's), or not ready yet
        if context.get("job") == job and context.get("workers") and not owner_gone(owner):
            found.append(context)
    return found


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
