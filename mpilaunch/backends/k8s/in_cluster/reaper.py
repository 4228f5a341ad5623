"""Entry point of a job's reaper (the pod of the Job ``<job>-reaper``).

``python3 -m mpilaunch.backends.k8s.in_cluster.reaper JOB --orphan-timeout SEC [--deadline SEC]``:
an attached job's. Runs with the ServiceAccount ``<job>-reaper``, whose Role
allows ``get`` on the Lease ``<job>`` and ``delete`` on the
ConfigMap ``<job>``, by name, and nothing else. It deletes the job's root
when the submitting mpilaunch stopped renewing the Lease for SEC seconds or
the job passed ``--deadline`` seconds (see ``backends/k8s/orphan.py``); the
garbage collector removes everything else, the reaper included. It exits 0
when the job is gone either way.

``... JOB --orphan-timeout SEC --launcher-job NAME --start-bound SEC``: a
detached job's (``--detach``). It watches the launcher Job instead; when
the launcher ends, or can no longer run, without recording the job's
outcome, it records one and releases the workers
(``backends/k8s/in_cluster/detached.py``), then exits 0. Its Role: the root ConfigMap
(get, patch), the launcher Job (get, delete), the worker pods and the job's
Secrets (delete).

In-cluster credentials (``KUBERNETES_SERVICE_HOST/PORT``, the token under
``$MPILAUNCH_K8S_SA_DIR``); standard library only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from ....core.exit_codes import EXIT_FAILED
from .. import mesh
from ..api import Api, ApiError, sa_dir
from ..credentials import CredentialError
from ..orphan import reap


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} mpilaunch-reaper: {message}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    try:
        return reaper_main(argv)
    finally:  # every exit, SIGTERM's included: a kept mesh's sidecar ends, so that this Job can complete
        mesh.quit_if_injected(log)


def reaper_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python3 -m mpilaunch.backends.k8s.in_cluster.reaper")
    p.add_argument("job")
    p.add_argument("--orphan-timeout", type=float, required=True)
    p.add_argument("--deadline", type=float, help="seconds from now after which the job is deleted regardless")
    p.add_argument("--launcher-job", help="a detached job's launcher Job: watch it instead of the Lease")
    p.add_argument(
        "--start-bound", type=float, default=330.0, help="with --launcher-job: seconds its pod may take to start"
    )
    args = p.parse_args(argv)
    # The pod's SIGTERM comes when the job is being deleted (its own doing or the owner's): end now.
    # As its container's PID 1 it would otherwise ignore SIGTERM and hold the job's release until
    # the grace period's SIGKILL (seen: 3.8 s of a 2-pod job's 5 s release on the real node).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        namespace = Path(sa_dir(), "namespace").read_text().strip()
    except OSError:
        namespace = "default"
    api = Api({"in_cluster": True, "sa_dir": sa_dir(), "namespace": namespace})
    if args.launcher_job:
        return watch_launcher(api, args, namespace)
    log(
        f"watching Lease {args.job} in {namespace}: orphan timeout {args.orphan_timeout:g}s"
        + (f", deadline {args.deadline:g}s" if args.deadline else "")
    )
    try:
        reason = reap(api, args.job, args.orphan_timeout, args.deadline, log=log)
    except (ApiError, CredentialError) as e:
        log(f"cannot delete job {args.job}: {e}")
        return EXIT_FAILED  # the pod restarts (restartPolicy OnFailure) and tries again
    log(f"deleted job {args.job}: {reason}" if reason else f"job {args.job} was deleted by its owner")
    return 0


def watch_launcher(api: Api, args, namespace: str) -> int:
    # a detached job's reaper only: an attached job's starts without these modules (the launch
    # description, the MPI flavours), on the node where the job's pods are starting
    from .detached import reap_detached

    log(
        f"watching the launcher Job {args.launcher_job} of detached job {args.job} in {namespace}: "
        f"start bound {args.start_bound:g}s, orphan timeout {args.orphan_timeout:g}s"
    )
    said = reap_detached(api, args.job, args.launcher_job, args.start_bound, args.orphan_timeout, log=log)
    if said is None:
        log(f"job {args.job} was deleted by its owner")
    elif said:
        log(f"recorded the outcome of job {args.job}: {said}")
    else:
        log(f"the launcher of job {args.job} recorded its outcome; its workers are released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
