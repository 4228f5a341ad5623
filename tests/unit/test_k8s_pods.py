"""Reading pod states: what the Kubernetes backend concludes from a pod's status (pure)."""

from mpilaunch.backends.k8s.pods import launcher_started, pod_problem


def pod(phase, *container_states):
    return {
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"state": state} for state in container_states],
        }
    }


def test_a_launcher_that_already_finished_has_started():
    """The container's end reaches the API server before the pod's phase does: the launcher
    of a --retries attempt that succeeded at once is still phase Running for a moment."""
    finished = pod("Running", {"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert launcher_started(finished)
    assert pod_problem(finished) == ("container exited with 0 (Completed)", True)  # fatal for a worker pod
    assert launcher_started(pod("Pending", {"running": {}}))
    assert launcher_started(pod("Succeeded"))
    assert launcher_started(pod("Failed"))


def test_a_launcher_that_cannot_start_has_not():
    pulling = pod("Pending", {"waiting": {"reason": "ErrImagePull", "message": "no such image"}})
    assert not launcher_started(pulling)
    assert pod_problem(pulling) == ("ErrImagePull: no such image", True)
    assert not launcher_started(pod("Pending"))
    assert not launcher_started({"status": {}})


def test_launcher_done_line_counts_only_with_the_launch_token():
    from mpilaunch.backends.k8s.pods import LAUNCHER_DONE, parse_launcher_done

    assert parse_launcher_done(f"{LAUNCHER_DONE}0 token=abc\n", "abc") == 0
    assert parse_launcher_done(f"{LAUNCHER_DONE}7 token=abc", "abc") == 7
    # a rank that prints the same words without the token (or another's) does not end the job
    assert parse_launcher_done(f"{LAUNCHER_DONE}0 token=xyz", "abc") is None
    assert parse_launcher_done(f"{LAUNCHER_DONE}0", "abc") is None
    assert parse_launcher_done("mpilaunch: launcher: openmpi 5, 2 workers ready", "abc") is None
    assert parse_launcher_done(f"{LAUNCHER_DONE}x token=abc", "abc") is None


def test_the_wait_for_a_small_jobs_pods_looks_often_at_first_and_at_the_usual_pace_later():
    from mpilaunch.backends.k8s.pods import SLOW_POLL_S, ready_poll_s

    assert ready_poll_s(0.0, 3) <= 0.1  # a 2-pod job's pods are Ready 1-2 s in: no 0.25 s lost on average
    assert ready_poll_s(30.0, 3) == SLOW_POLL_S  # a wait that long is for capacity, not a pod start
    assert ready_poll_s(0.0, 1024) == SLOW_POLL_S  # a list of 1024 pods ten times a second is a load
