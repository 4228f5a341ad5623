"""--detach on Kubernetes when the launcher pod dies: the job's reaper records the outcome and releases the workers.

The rules (``backends/k8s/in_cluster/outcome.py``) are pure functions of the
launcher Job's status and of when the reaper saw it, tested here without a
cluster. The kwok test runs the reaper against a real API server (playing the
kubelet for the reaper pod, as the SIGKILL tests of test_k8s.py do); the
real-pod tests (test_real_pods.py, ``-k detach``) kill or delete a real
launcher pod.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from mpilaunch.backends.k8s.in_cluster.outcome import Ending, from_condition, judge, observe, start
from support.helpers import REPO, wait_for
from support.k8s import access, end_processes, leftover_objects, manage_k8s, run_reaper_pod

NAME = "job-launcher"
BOUNDS = {"name": NAME, "start_bound": 330.0, "lost_bound": 10.0}


def job(ready=None, active=None, terminating=None, conditions=()) -> dict:
    """A launcher Job as the API server shows it (only the status fields the rules read)."""
    status = {k: v for k, v in (("ready", ready), ("active", active), ("terminating", terminating)) if v is not None}
    return {"status": {**status, "conditions": [{"status": "True", **c} for c in conditions]}}


def failed(reason: str, message: str) -> dict:
    return job(ready=0, conditions=[{"type": "Failed", "reason": reason, "message": message}])


# ------------------------------------------------------------------ the rules (pure)


def test_detach_a_running_launcher_is_left_alone_however_long_it_runs():
    seen = observe(start(0.0), job(ready=1, active=1), 1.0)
    for now in (10.0, 1000.0, 100000.0):
        seen = observe(seen, job(ready=1, active=1), now)
        assert judge(seen, job(ready=1, active=1), now, **BOUNDS) is None


def test_detach_sigkilled_launcher_ends_with_its_exit_code_from_the_pod_failure_policy():
    message = (
        "Container launcher for pod default/j-launcher-x7k2p failed with exit code 137 matching FailJob rule at index 1"
    )
    ending = judge(
        observe(start(0.0), failed("PodFailurePolicy", message), 5.0),
        failed("PodFailurePolicy", message),
        5.0,
        **BOUNDS,
    )
    assert ending == Ending(
        137,
        "the launcher container ended with exit code 137 (SIGKILL: out of memory, or "
        f"killed) (Job {NAME}: PodFailurePolicy: {message})",
        False,
    )


@pytest.mark.parametrize(
    "cond, code, says",
    [
        (
            {
                "type": "Failed",
                "reason": "PodFailurePolicy",
                "message": "Pod default/j-launcher-x has condition DisruptionTarget matching FailJob rule at index 0",
            },
            5,
            "the launcher pod was disrupted (evicted, preempted, or its node drained or lost)",
        ),
        (
            {
                "type": "FailureTarget",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            },
            5,
            "the launcher pod failed or was deleted (Job job-launcher: BackoffLimitExceeded: Job has reached",
        ),
        (
            {
                "type": "Failed",
                "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline",
            },
            124,
            "the job ran past its cluster-side deadline",
        ),
        ({"type": "Complete"}, 0, None),
    ],
)
def test_detach_the_job_controllers_verdict_names_the_cause(cond, code, says):
    """FailureTarget counts: from k8s 1.31 Failed waits for the pod to be gone, which a lost node delays."""
    ending = from_condition({"status": "True", **cond}, NAME)
    assert ending.exit_code == code and not ending.release_launcher
    assert (ending.failure is None) if says is None else ending.failure.startswith(says), ending


def test_detach_a_launcher_that_stops_being_ready_is_lost_after_the_orphan_timeout():
    """Its node stopped reporting (the pod is marked not Ready) or it is stuck being deleted:
    nothing will end it, so the reaper does, and deletes the launcher Job to free its node."""
    seen = observe(start(0.0), job(ready=1, active=1), 1.0)
    stuck = job(ready=0, active=0, terminating=1)
    seen = observe(seen, stuck, 20.0)
    assert judge(seen, stuck, 29.9, **BOUNDS) is None
    ending = judge(observe(seen, stuck, 30.0), stuck, 30.0, **BOUNDS)
    assert ending.exit_code == 5 and ending.release_launcher
    assert ending.failure == (
        f"the launcher pod of Job {NAME} is being deleted and has not ended for 10s "
        "(--orphan-timeout 10s): its node is likely lost"
    )
    # Ready again in time (a short node hiccup): the clock starts over
    seen = observe(observe(seen, job(ready=1, active=1), 25.0), stuck, 26.0)
    assert judge(seen, stuck, 35.0, **BOUNDS) is None


def test_detach_a_launcher_pod_that_never_starts_fails_the_allocation_after_the_start_bound():
    pending = job(ready=0, active=1)
    seen = observe(start(0.0), pending, 1.0)
    assert judge(seen, pending, 329.0, **BOUNDS) is None
    ending = judge(seen, pending, 330.0, **BOUNDS)
    assert ending == Ending(
        3,
        f"the launcher pod of Job {NAME} did not start within 330s (--start-timeout + 30s): "
        "it cannot be scheduled, or its image pulled",
        True,
    )
    no_pod = job(ready=0)  # the Job controller could not create it (a quota)
    assert "got no pod within 330s" in judge(observe(start(0.0), no_pod, 1.0), no_pod, 331.0, **BOUNDS).failure


def test_detach_a_launcher_job_not_yet_created_is_waited_for_but_a_deleted_one_is_gone():
    """The reaper starts before the launcher Job exists: a 404 is "not yet" until the Job has been seen."""
    seen = start(0.0)
    assert judge(seen, None, 100.0, **BOUNDS) is None
    assert judge(seen, None, 330.0, **BOUNDS).exit_code == 3  # the submitting side died before creating it
    seen = observe(seen, job(ready=1, active=1), 5.0)
    assert judge(seen, None, 6.0, **BOUNDS) == Ending(5, f"the launcher Job {NAME} was deleted", False)


# ------------------------------------------------------------------ what a detached job creates (no cluster)


def test_detach_renders_a_reaper_that_watches_the_launcher_with_a_by_name_role(tmp_path):
    from mpilaunch.backends.k8s.backend import K8sBackend as Backend
    from mpilaunch.backends.k8s.options import K8sOptions
    from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan

    spec = JobSpec(
        command=("true",),
        backend="k8s",
        name="dj",
        np=2,
        timeout=100,
        detach=True,
        orphan_timeout=20,
        backend_options=K8sOptions(image="img", namespace="default"),
    )
    plan = Plan(
        job_name="dj",
        workers=(WorkerPlan(name="dj-worker-0", slots=1, gpus=0), WorkerPlan(name="dj-worker-1", slots=1, gpus=0)),
    )
    backend = Backend(spec, plan, tmp_path)
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for _, obj in backend.objects()}
    assert ("Lease", "dj") not in objects  # nobody renews a detached job's heartbeat
    groups = [group for group, _ in backend.objects()]
    assert groups.index("reaper") < groups.index("workers")  # a worker never exists without its reaper
    command = objects[("Job", "dj-reaper")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "/opt/mpilaunch-tools/mpilaunch-reaper",
        "dj",
        "--orphan-timeout",
        "20",
        "--launcher-job",
        "dj-launcher",
        "--start-bound",
        "330",
    ]
    rules = {
        (r["apiGroups"][0], r["resources"][0]): (r["verbs"], r["resourceNames"])
        for r in objects[("Role", "dj-reaper")]["rules"]
    }
    assert rules == {
        ("batch", "jobs"): (["get", "delete"], ["dj-launcher"]),
        ("", "configmaps"): (["get", "patch"], ["dj"]),
        ("", "pods"): (["delete"], ["dj-worker-0", "dj-worker-1"]),
        ("", "secrets"): (["delete"], ["dj-env", "dj-agent"]),  # once the outcome is recorded
    }
    launcher = objects[("Job", "dj-launcher")]["spec"]
    assert launcher["backoffLimit"] == 0 and launcher["activeDeadlineSeconds"] == 300 + 100 + 30
    assert [r["action"] for r in launcher["podFailurePolicy"]["rules"]] == ["FailJob", "FailJob"]
    # the launcher ends a detached job at --timeout itself (exit 124); the Job's deadline backs it up
    assert backend.launch_description().spec["timeout"] == 100


# ------------------------------------------------------------------ kwok: the reaper against a real API server


def test_detach_launcher_pod_deleted_and_never_ending_is_reaped_on_kwok(kube, k8s_env, tmp_path):
    """kwok ends no container, so a deleted launcher pod stays Terminating, as on a lost node: the reaper
    records exit 5 after --orphan-timeout, deletes the workers and the launcher Job, and exits 0;
    `status` and `wait` say what happened, and the record stays until `mpilaunch delete`."""
    name = "k8s-detach-lost"
    submit = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--orphan-timeout",
            "5",
            "--detach",
            "-q",
            "--",
            "true",
        ],
        cwd=REPO,
        env=k8s_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submit.returncode == 0, submit.stderr
    reaper = None
    try:
        reaper = run_reaper_pod(kube, k8s_env, name, tmp_path)
        sa = f"{name}-reaper"
        assert access(kube, sa, "get", "jobs", f"{name}-launcher", group="batch")
        assert access(kube, sa, "delete", "jobs", f"{name}-launcher", group="batch")
        assert not access(kube, sa, "get", "jobs", "other-launcher", group="batch")
        assert access(kube, sa, "patch", "configmaps", name) and not access(kube, sa, "delete", "configmaps", name)
        assert access(kube, sa, "delete", "pods", f"{name}-worker-1")
        assert not access(kube, sa, "get", "pods", f"{name}-worker-1")
        # the job's Secrets, once the outcome is recorded: delete them by name, never read them
        assert access(kube, sa, "delete", "secrets", f"{name}-env") and access(
            kube, sa, "delete", "secrets", f"{name}-agent"
        )
        assert not access(kube, sa, "get", "secrets", f"{name}-env")
        assert not access(kube, sa, "delete", "secrets", "other-env")
        assert not access(kube, sa, "delete", "pods", "other-worker-0")

        def launcher_pod():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={name},mpilaunch/role=launcher")["items"]
            return pods[0]["metadata"]["name"] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(launcher_pod, 60, "the launcher pod")
        time.sleep(3)  # the reaper sees it Ready
        kube.kubectl("delete", "pod", pod, "--wait=false")
        t0 = time.monotonic()
        wait_for(
            lambda: not kube.get_json("pods", "-l", f"mpilaunch/job={name},mpilaunch/role=worker")["items"],
            60,
            "the worker pods to go",
        )
        gone_s = time.monotonic() - t0
        _, err = reaper.communicate(timeout=30)
        assert reaper.returncode == 0 and f"recorded the outcome of job {name}: exit 5: " in err, err
        status = manage_k8s(k8s_env, "status", name)
        assert status.returncode == 0, status.stderr
        assert "Failed (exit 5)" in status.stdout, status.stdout
        assert (
            f"  outcome: the launcher pod of Job {name}-launcher is being deleted and has not ended for "
            in status.stdout
        ), status.stdout
        assert "the launcher recorded no outcome, so the job's reaper released its workers" in status.stdout
        wait = manage_k8s(k8s_env, "wait", name)
        assert wait.returncode == 5 and wait.stderr.startswith("mpilaunch: error: the launcher pod of Job "), wait
        record = json.loads(kube.get_json("configmap", name)["data"]["result.json"])
        assert record["recorded_by"] == "reaper" and record["exit_code"] == 5
        # issue 49: the forwarded values and the agents' key outlived the job; gone with the record
        assert kube.kubectl("get", "secrets", "-l", f"mpilaunch/job={name}", "-o", "name").stdout.split() == []
        assert not kube.kubectl("get", "job", f"{name}-launcher", "--ignore-not-found", "-o", "name").stdout.strip()
        print(f"{name}: workers gone {gone_s:.1f}s after the launcher pod's deletion (--orphan-timeout 5)")
    finally:
        end_processes(reaper)
        manage_k8s(k8s_env, "delete", name)
    assert leftover_objects(kube, name) == []


def settled_pod_count(kube, quiet_s: float = 3.0, timeout: float = 120.0) -> int:
    """The namespace's pods that count against a pod quota (not Succeeded or Failed), once none has
    come or gone for ``quiet_s``: an earlier test's Jobs can make a pod again while garbage
    collection deletes them, and that pod would take this test's place under its quota."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        pods = kube.get_json("pods")["items"]
        counted = sorted(
            p["metadata"]["uid"] for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
        if counted != last or any(p["metadata"].get("deletionTimestamp") for p in pods):
            last, since = counted, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return len(counted)
        assert time.monotonic() < deadline, f"the namespace's pods never settled: {last}"
        time.sleep(0.5)


def test_detach_launcher_pod_never_created_under_a_quota_is_reaped_after_the_start_bound_on_kwok(
    kube, k8s_env, tmp_path
):
    """A pod quota that the reaper and the workers use up: the Job controller cannot create the launcher
    pod. Nothing would ever end the job; its reaper does at --start-timeout + 30 s: exit 3, the workers
    and the launcher Job deleted."""
    name = "k8s-detach-quota"
    in_use = settled_pod_count(kube)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": f"{name}-pods"},
        "spec": {"hard": {"pods": str(in_use + 3)}},
    }  # the reaper and 2 workers, no launcher
    kube.apply(quota)
    reaper = None
    try:
        used = wait_for(
            lambda: ((kube.get_json("resourcequota", f"{name}-pods").get("status") or {}).get("used") or {}).get(
                "pods"
            ),
            30,
            "the quota's usage",
        )
        assert int(used) == in_use, f"the quota counts {used} pods, {in_use} were seen: another test's pod came"
        submit = subprocess.run(
            [
                sys.executable,
                "-m",
                "mpilaunch",
                "--backend",
                "k8s",
                "--image",
                "img",
                "--name",
                name,
                "--np",
                "2",
                "--slots-per-worker",
                "1",
                "--start-timeout",
                "5",
                "--detach",
                "-q",
                "--",
                "true",
            ],
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # a refusal here means another pod took the job's place: name them (the quota's usage is in stderr)
        assert submit.returncode == 0, submit.stderr + kube.kubectl("get", "pods", "--show-labels").stdout
        t0 = time.monotonic()
        try:
            reaper = run_reaper_pod(kube, k8s_env, name, tmp_path)
        except AssertionError as e:  # which pod took the reaper's place under the quota (seen once under load)
            pods = kube.kubectl("get", "pods", "-o", "wide", "--show-labels", check=False).stdout
            events = kube.kubectl("get", "events", "--field-selector", "reason=FailedCreate", check=False).stdout
            raise AssertionError(f"{e}\npods:\n{pods}\nrefused creations:\n{events}") from None
        _, err = reaper.communicate(timeout=90)
        took = time.monotonic() - t0
        assert reaper.returncode == 0 and f"recorded the outcome of job {name}: exit 3: " in err, err
        assert took >= 35 - 5, f"reaped after {took:.0f}s: before the start bound"
        wait_for(
            lambda: not kube.get_json("pods", "-l", f"mpilaunch/job={name},mpilaunch/role=worker")["items"],
            30,
            "the worker pods to go",
        )
        assert not kube.kubectl("get", "job", f"{name}-launcher", "--ignore-not-found", "-o", "name").stdout.strip()
        status = manage_k8s(k8s_env, "status", name)
        assert (
            "Failed (exit 3)" in status.stdout
            and (
                f"  outcome: the launcher Job {name}-launcher got no pod within 35s (--start-timeout + 30s): the "
                "cluster refused to create one (a ResourceQuota, "
            )
            in status.stdout
        ), status.stdout
        print(f"{name}: reaped {took:.1f}s after submission (start bound 35 s)")
    finally:
        end_processes(reaper)
        kube.kubectl("delete", "resourcequota", f"{name}-pods", "--ignore-not-found", check=False)
        manage_k8s(k8s_env, "delete", name)
    assert leftover_objects(kube, name) == []
