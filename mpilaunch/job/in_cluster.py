"""The one in-cluster runner: what a cluster backend's launcher (a pod, a container) does with
its launch description, whatever the backend.

Every launcher runs the same sequence: the job's spec and plan from the description, the
mpirun workload with the submitting side's status token, mpirun's lines handed on untouched
(``RelayedOutput``), the attempt number the description carries (``--retries``), and the
lifecycle (``run_job``) quiet, as on the submitting machine. A backend's launcher supplies
only what differs: how to reach the workers (its backend: ``ReadyPods``,
``PublishedContainers``), where mpirun's lines go (``relay``) and, after the run, where the
outcome is posted (a pod's last log line or ConfigMap, a key of skein's store).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Callable

from ..core import mpi
from ..core.launcher_lines import NOTES
from ..core.result import JobResult
from ..workloads.mpirun import MpirunWorkload, RelayedOutput
from .lifecycle import run_job


def run_launch(
    launch,
    info: mpi.MpiInfo,
    rundir: Path,
    reach_workers: Callable,
    relay: Callable[[str, str], None],
    configure: Callable[[MpirunWorkload], None] | None = None,
) -> tuple[JobResult, MpirunWorkload]:
    """Run the job ``launch`` (a ``LaunchDescription``) describes with the MPI ``info`` found here.

    ``reach_workers(spec, plan)`` is the backend that reaches the workers from here;
    ``relay(stream, line)`` takes mpirun's lines; ``configure(workload)`` sets what one backend's
    launcher adds (YARN: a hook when mpirun starts). Returns the result
    and the workload (its ``token`` ends the submitting side's follow)."""
    spec, plan = launch.job_spec(), launch.plan()
    backend = reach_workers(spec, plan)
    workload = MpirunWorkload(spec, launch.job, plan, info)
    workload.use_output(RelayedOutput(relay))
    workload.token = launch.status_token or workload.token  # the submitting side's
    # mpirun's working directory where it exists here (YARN: the submitting side's); else the launcher's own
    workload.cwd = launch.cwd if launch.cwd and os.path.isdir(launch.cwd) else None
    if configure is not None:
        configure(workload)
    environ = dict(os.environ)
    # a relaunch (--retries): the submitting side started this launcher for attempt N
    workload.bind(backend, rundir, environ, attempt=launch.attempt)
    result = run_job(
        spec,
        workload,
        backend,
        rundir,
        None,
        stdout=sys.stdout,
        stderr=NotesToRelay(relay, sys.stderr),
        environ=environ,
        quiet=True,
    )
    return result, workload


class NotesToRelay(io.TextIOBase):
    """The lifecycle's stderr in a launcher: its own verdict lines (``launcher_lines.NOTES``:
    ``--preflight``'s findings, ``--straggler-report``'s) go where mpirun's lines go (``relay``),
    which the submitting side shows the user; the rest to this process's stderr. A pod's stderr
    is followed anyway, a YARN launcher container's log is not: there the lines were lost."""

    def __init__(self, relay: Callable[[str, str], None], stderr):
        self.relay, self.stderr, self.pending = relay, stderr, ""

    def write(self, text: str) -> int:
        self.pending += text  # print() writes a line and its newline apart
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if line.startswith(NOTES):
                self.relay("stderr", line + "\n")
            else:
                self.stderr.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stderr.flush()
