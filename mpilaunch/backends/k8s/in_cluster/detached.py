"""A detached Kubernetes job's end in the cluster: its outcome record, and the reaper that watches its launcher.

Nobody on the submitting side watches a detached job. Its launcher records
the outcome in the root ConfigMap (``result.json``, read by ``mpilaunch
status`` and ``wait``) and deletes the worker pods, on every exit path it
lives to see. The reaper (``python3 -m mpilaunch.backends.k8s.in_cluster.reaper JOB
--launcher-job NAME``, the pod of the Job ``<job>-reaper``) covers the
others: when the launcher Job ends, or can no longer run, without an
outcome recorded (``outcome.py`` reads why), it records one after a
short grace period, deletes the workers (and a launcher pod that still
holds a node), and exits. The record stays, as for any detached job that
ended, until ``mpilaunch delete NAME``.

Its ServiceAccount may get/patch the root ConfigMap, get/delete the
launcher Job and delete the worker pods, each by name, nothing else
(``k8s-reaper.yaml.j2``). Standard library only: it runs in the job's image.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from ...launch_description import LaunchDescription
from ..api import Api, ApiError
from ..launch import job_secret_names
from ..pods import RESULT_KEY
from . import outcome as launcher_outcome

# After the launcher is seen to have ended without a record: a force-deleted
# pod's container may still run for a moment and write its own, which says more.
GRACE_S = 5.0
POLL_S = 2.0


def outcome(exit_code: int, failure: str | None, ranks=(), **extra) -> dict:
    """The ``result.json`` record: what ``mpilaunch status`` and ``wait`` read."""
    return {
        "exit_code": exit_code,
        "failure": failure,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ranks": list(ranks),
        **extra,
    }


def record_outcome(api: Api, job: str, record: dict) -> bool:
    """Write ``record`` into the root ConfigMap unless an outcome is there already: the first writer
    (the launcher, or the reaper when the launcher could not) wins. False: one was there.

    The patch carries the root's resourceVersion, so a record written between the read and
    the patch makes it fail (409) rather than be overwritten."""
    for _ in range(5):
        root = api.get("v1", "configmaps", job)
        if RESULT_KEY in (root.get("data") or {}):
            return False
        body = {
            "metadata": {"resourceVersion": root["metadata"]["resourceVersion"]},
            "data": {RESULT_KEY: json.dumps(record)},
        }
        try:
            api.patch("v1", "configmaps", job, body)
            return True
        except ApiError as e:
            if e.status != 409:
                raise
    return False


def _description(root: dict) -> LaunchDescription | None:
    text = (root.get("data") or {}).get("launch.json")
    return LaunchDescription.from_dict(json.loads(text)) if text else None


def worker_names(root: dict) -> list[str]:
    """The worker pods of a job with a cluster launcher, from its launch description (none without one)."""
    description = _description(root)
    return list(description.addresses()) if description else []


def secret_names(root: dict) -> list[str]:
    """The Secrets of a job with a cluster launcher (none without one)."""
    description = _description(root)
    return job_secret_names(description.job, description.cluster.get("transport")) if description else []


def delete_secrets(api: Api, names: list[str], log: Callable[[str], None]) -> None:
    """Delete the job's Secrets once its outcome is recorded: nothing of the job reads them any more,
    and the root, which stays until ``mpilaunch delete``, would otherwise keep them too."""
    for name in names:
        try:
            api.delete("v1", "secrets", name)
        except ApiError as e:
            if e.status != 404:  # gone already: the other of launcher and reaper deleted it
                log(f"cannot delete Secret {name}: {e}")
        except OSError as e:
            log(f"cannot delete Secret {name}: {e}")


def release(api: Api, workers: list[str], launcher_job: str | None, log: Callable[[str], None]) -> None:
    """Delete the worker pods (at once: nothing of the job runs in them any more) and, when given,
    the launcher Job, whose pod is stuck holding a node."""
    for name in workers:
        try:
            api.delete("v1", "pods", name, gracePeriodSeconds=0)
        except (ApiError, OSError) as e:
            log(f"cannot delete worker pod {name}: {e}")
    if launcher_job:
        try:
            api.delete("batch/v1", "jobs", launcher_job, propagationPolicy="Background")
        except (ApiError, OSError) as e:
            log(f"cannot delete the launcher Job {launcher_job}: {e}")


def _get(api: Api, api_version: str, plural: str, name: str) -> dict | None:
    """The object, or None when it does not exist; an unreachable API server raises."""
    try:
        return api.get(api_version, plural, name)
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def reap_detached(
    api: Api,
    job: str,
    launcher_job: str,
    start_bound: float,
    lost_bound: float,
    *,
    log: Callable[[str], None],
    clock=time.monotonic,
    sleep=time.sleep,
) -> str | None:
    """Watch the launcher Job until the job has ended; make sure its workers are released.

    Returns what the reaper recorded, "" when the launcher recorded the outcome itself,
    None when the job was deleted (its root is gone) meanwhile. API errors are retried.
    """
    seen = launcher_outcome.start(clock())
    ended_at = None  # when an ending without a record was first seen
    while True:
        try:
            root = _get(api, "v1", "configmaps", job)
            if root is None:
                return None
            obj = _get(api, "batch/v1", "jobs", launcher_job)
        except (ApiError, OSError) as e:  # not a verdict: the API server may be busy or restarting
            log(f"cannot read the job's state ({str(e)[:200]}); retrying")
            sleep(POLL_S)
            continue
        seen = launcher_outcome.observe(seen, obj, clock())
        ending = launcher_outcome.judge(
            seen, obj, clock(), name=launcher_job, start_bound=start_bound, lost_bound=lost_bound
        )
        if ending is None:
            ended_at = None
        elif RESULT_KEY in (root.get("data") or {}):
            # the launcher spoke (and ended, or is ending: its Job is left for its log);
            # its workers and Secrets go again in case one of its deletes failed
            release(api, worker_names(root), None, log)
            delete_secrets(api, secret_names(root), log)
            return ""
        elif ended_at is None:
            ended_at = clock()
        elif clock() - ended_at >= GRACE_S:
            failure = launcher_outcome.recorded_failure(ending)
            try:
                recorded = record_outcome(api, job, outcome(ending.exit_code, failure, recorded_by="reaper"))
            except (ApiError, OSError) as e:
                log(f"cannot record the outcome in ConfigMap {job} ({str(e)[:200]}); retrying")
                sleep(POLL_S)
                continue
            release(api, worker_names(root), launcher_job if ending.release_launcher else None, log)
            delete_secrets(api, secret_names(root), log)
            if not recorded:
                return ""  # the launcher's own record came first
            return f"exit {ending.exit_code}: " + (failure or "the launcher succeeded but recorded no outcome")
        sleep(POLL_S)
