"""--preflight across workers: the link test (``preflight/link_probe.py``) under the job's own mpirun.

One rank per worker, launched exactly as the job's ranks are (the same mpirun,
agents or exec channel, rank wrapper and ``--mpi-args``), so a link, a worker
or an MPI setting that would slow or stop the job slows or stops this first.
The hostfile it writes is the job's own path, written again when the job starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pkgutil
import subprocess
import sys
import time

from ..core import mpi
from ..preflight.checks import MIN_LINK_SLOWER_S
from ..preflight.link_probe import MARK, SONAMES
from ..runtime.procs import terminate_group
from .mpirun_command import build_launch, without_stale_session

#: the message each link carries (and each rank gives the allreduce), and how often (best of)
LINK_BYTES = 1 << 20
REPEATS = 3


def probe_text() -> str:
    return pkgutil.get_data("mpilaunch.preflight", "link_probe.py").decode()


def library_candidates(info: mpi.MpiInfo) -> list[str]:
    """Where the mpirun's own MPI library is, beside its prefix (PyPI's Open MPI in a venv: the
    system's libmpi.so.40 of another major version may be first on the loader's path); the probe
    skips a path its worker does not have and then asks the loader for the flavour's soname."""
    if not info.path:
        return []
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(info.path))), "lib")
    return [os.path.join(libdir, name) for name in SONAMES.get(info.flavour, SONAMES["openmpi"])]


def link_python(backend) -> str:
    """The program the link test's ranks run: this interpreter where the workers are on this host,
    else the rank wrapper's own python where it names one plainly (ssh's --remote-python), else
    the image's python3 (a pod's wrapper is a script)."""
    if backend.workers_on_this_host:
        return sys.executable
    first = (backend.rank_prefix() or [""])[0]
    plain = first and not any(c in first for c in "$\"' ")
    return first if plain and "python" in os.path.basename(first) else "python3"


def parse(stdout: str) -> dict[int, dict]:
    """rank -> its line, from mpirun's output (rank tags and all)."""
    rows = {}
    for line in stdout.splitlines():
        at = line.find(MARK)
        if at < 0:
            continue
        try:
            said = json.loads(line[at + len(MARK) :])
            rows[int(said["rank"])] = said
        except (ValueError, KeyError, TypeError):
            continue
    return rows


def measure(run, workload, deadline_s: float, margin: float) -> tuple[dict[int, dict], str | None, float]:
    """Run the link test once: (rank -> its line, why it failed or None, seconds it took)."""
    plan = dataclasses.replace(
        workload.plan, workers=tuple(dataclasses.replace(w, slots=1, gpus=0) for w in workload.plan.workers)
    )
    info = workload.info
    spec = dataclasses.replace(
        workload.spec,
        command=(
            link_python(workload.bound[0]),
            "-c",
            probe_text(),
            info.flavour,
            str(LINK_BYTES),
            str(REPEATS),
            str(margin),
            str(MIN_LINK_SLOWER_S),
            *library_candidates(info),
        ),
        bind_gpus=False,
    )
    backend, rundir, environ = workload.bound
    hostfile_text, command = build_launch(spec, plan, info, rundir, backend, environ, token=workload.token)
    (rundir / "hostfile").write_text(hostfile_text)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        without_stale_session(command.argv, info),
        env={**environ, **command.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workload.cwd,
        start_new_session=True,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        terminate_group(proc)
        out, err = proc.communicate()
        return parse(out or ""), f"it did not end within {deadline_s:.0f} s", time.monotonic() - t0
    rows = parse(out)
    failure = None
    if proc.returncode != 0 or len(rows) < len(plan.workers):
        said = [line for line in (err or "").splitlines() if line.strip() and "mpilaunch-rank-" not in line]
        failure = f"mpirun exited with code {proc.returncode}" + (f": {said[-1].strip()[:200]}" if said else "")
    return rows, failure, time.monotonic() - t0
