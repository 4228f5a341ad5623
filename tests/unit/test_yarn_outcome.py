"""A detached YARN job's outcome as its final diagnostics carry it (pure; no cluster)."""

from mpilaunch.backends.yarn import outcome as yo


def test_detach_outcome_round_trips_exit_code_failure_and_launcher_log():
    diag = yo.diagnostics(
        7, "rank 2 on worker j-worker-1 exited with code 7\nlast lines...", "container_1_0001_01_000004", "nm1:8042"
    )
    assert diag == (
        "mpilaunch: exit 7: rank 2 on worker j-worker-1 exited with code 7\n"
        "launcher log: container_1_0001_01_000004 on nm1:8042"
    )
    assert yo.outcome("FINISHED", "FAILED", diag) == ("FAILED", 7, "rank 2 on worker j-worker-1 exited with code 7")
    assert yo.launcher_log(diag) == ("container_1_0001_01_000004", "nm1:8042")
    assert yo.outcome("FINISHED", "SUCCEEDED", yo.diagnostics(0, None, None, None)) == ("SUCCEEDED", 0, None)


def test_detach_outcome_of_running_killed_and_foreign_endings():
    assert yo.outcome("RUNNING", "UNDEFINED", "") == ("RUNNING", None, None)
    phase, code, failure = yo.outcome("KILLED", "KILLED", "Application killed by user.")
    assert (phase, code) == ("KILLED", 130) and "killed" in failure
    phase, code, failure = yo.outcome("FAILED", "FAILED", "AM container exited with exitCode: 1")
    assert (phase, code) == ("FAILED", 1) and "AM container exited" in failure


def test_detach_log_contents_strips_the_nodemanagers_framing():
    framed = (
        "Container: container_x on localhost:1\nLogAggregationType: LOCAL\n====\nLogType:launcher.log\n"
        "LogLength:6\nLogContents:\nhello\nEnd of LogType:launcher.log.\n*****\n"
    )
    assert yo.log_contents(framed) == "hello\n"
    assert yo.log_contents("raw line\n") == "raw line\n"
