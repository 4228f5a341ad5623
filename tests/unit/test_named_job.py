"""A job found by its name (backends/named_job.py): the job layer's `status` lines and `wait`
(job/manage.py), once for every backend, and each backend's mapping of what its cluster says
into the one phase vocabulary (Kubernetes: the root ConfigMap and the launcher pod; YARN: the
application report)."""

from __future__ import annotations

import datetime
import io
import json
import types

import pytest

from mpilaunch.backends.k8s.manage import job_state
from mpilaunch.backends.named_job import PHASES, JobEntry, JobState, JobStatus, NamedJob
from mpilaunch.backends.yarn.handoff import state_of
from mpilaunch.core.exit_codes import EXIT_INTERRUPTED, EXIT_TIMEOUT
from mpilaunch.job import manage


class ScriptedJob(NamedJob):
    """A job whose states come from a list, one per `state()` call (the last one repeats)."""

    poll_s = 0.0

    def __init__(self, states):
        super().__init__(types.SimpleNamespace(name="j"))
        self.states, self.asked = list(states), 0

    def state(self):
        self.asked += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    status = logs = delete = stacks = None  # not asked here


def test_named_job_wait_returns_the_jobs_exit_with_its_failure_and_summary():
    running = JobState("job j", "Running", elapsed=3)
    failed = JobState("job j", "Failed", 5, 12.4, "rank 1 exited with code 5", {"job": "j", "exit_code": 5})
    out, err = io.StringIO(), io.StringIO()
    job = ScriptedJob([running, running, failed])
    assert manage.wait(job, None, out, err) == 5 and job.asked == 3
    assert out.getvalue() == "job j failed (exit 5) after 12s\n"
    assert err.getvalue().startswith("mpilaunch: error: rank 1 exited with code 5\n")
    assert len(err.getvalue().splitlines()) > 1  # the closing summary follows


def test_named_job_wait_past_its_timeout_says_where_the_job_still_is():
    out, err = io.StringIO(), io.StringIO()
    job = ScriptedJob([JobState("job j (application_1_0001)", "Pending")])
    assert manage.wait(job, 0.0, out, err) == EXIT_TIMEOUT
    assert err.getvalue() == "mpilaunch: error: job j (application_1_0001) still Pending after --timeout 0s\n"
    assert out.getvalue() == ""


def test_named_job_status_lines_are_one_headline_and_indented_details():
    entry = JobEntry(
        "job j  namespace ns",
        JobState("job j", "Unknown", elapsed=7.2, note="(no launcher pod)"),
        "ranks=4 gpus=0",
        ["outcome: lost", "j-worker-0 worker Running"],
    )
    out = io.StringIO()
    manage.print_status(JobStatus([entry], ["not listed: x"]), out)
    assert out.getvalue().splitlines() == [
        "job j  namespace ns  Unknown (no launcher pod)  elapsed 7s  ranks=4 gpus=0",
        "  outcome: lost",
        "  j-worker-0 worker Running",
        "not listed: x",
    ]


def test_named_job_a_phase_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="RUNNING"):
        JobState("job j", "RUNNING")


def root(data=None, created="2026-12-07T06:00:00Z"):
    return {"metadata": {"name": "j", "creationTimestamp": created}, "data": data or {}}


def launcher_pod(phase, exit_code=None):
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    return {"status": {"phase": phase, "containerStatuses": [{"name": "launcher", "state": state}]}}


NOW = datetime.datetime(2026, 12, 7, 6, 0, 30, tzinfo=datetime.timezone.utc).timestamp()


@pytest.mark.parametrize(
    "data, launcher, expected",
    [
        # the outcome the launcher (or the reaper) recorded wins
        (
            {"result.json": json.dumps({"exit_code": 3, "failure": "rank 0 exited with code 3", "finished": None})},
            launcher_pod("Running"),
            ("Failed", 3, "rank 0 exited with code 3"),
        ),
        ({}, launcher_pod("Running"), ("Running", None, None)),
        ({}, launcher_pod("Pending"), ("Pending", None, None)),
        ({}, launcher_pod("Failed", 137), ("Failed", 137, "the launcher exited with code 137")),
        ({}, launcher_pod("Succeeded", 0), ("Succeeded", 0, None)),
        ({"launch.json": json.dumps({"detach": True})}, None, ("Unknown", None, None)),
        ({}, None, ("Attached", None, None)),
    ],
)
def test_named_job_k8s_states_map_into_the_vocabulary(data, launcher, expected):
    state = job_state("j", root(data), launcher, NOW)
    assert (state.phase, state.exit_code, state.failure) == expected
    assert state.phase in PHASES and state.label == "job j"
    assert state.exit_code is not None or state.elapsed == pytest.approx(30)


def report(state, final, diagnostics=""):
    return types.SimpleNamespace(
        id="application_1_0007",
        state=state,
        final_status=final,
        diagnostics=diagnostics,
        runtime=datetime.timedelta(seconds=42),
    )


@pytest.mark.parametrize(
    "yarn_state, final, diagnostics, expected",
    [
        ("ACCEPTED", "UNDEFINED", "", ("Pending", None)),
        ("RUNNING", "UNDEFINED", "", ("Running", None)),
        ("KILLED", "KILLED", "killed by user", ("Killed", EXIT_INTERRUPTED)),
        ("FINISHED", "SUCCEEDED", "", ("Succeeded", 0)),
        ("FINISHED", "FAILED", "", ("Failed", 1)),
    ],
)
def test_named_job_yarn_states_map_into_the_vocabulary(yarn_state, final, diagnostics, expected):
    state = state_of("j", report(yarn_state, final, diagnostics))
    assert (state.phase, state.exit_code) == expected
    assert state.label == "job j (application_1_0007)" and state.elapsed == 42
    assert (state.failure is not None) == bool(state.exit_code)
