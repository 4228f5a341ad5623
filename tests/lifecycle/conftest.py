"""The lifecycle harness: the real ``lifecycle.run_job`` driving the scripted fakes of tests/support.

``run_fake(*outcomes, backend=Script(...), workload=Script(...), **spec_options)``
runs one job of 4 ranks on two workers (``job-worker-0``: ranks 0-1,
``job-worker-1``: ranks 2-3) with --output-dir in tmp_path, and returns a
``FakeJob``: the shared call log, both fakes, the result (or the exception
run_job raised), stderr, and report.json read back. ``keep_records=N`` (with
``environ``'s MPILAUNCH_STATE_DIR) keeps the job's record and prints its summary,
as a job run from the command line does. The backend is the fake
with only the required surface (``FakeBackend``), except for a job with
--retries or a launcher in the cluster, which get ``FakeClusterBackend``: the
capabilities that ``check_spec`` asks of such a job.

The lost-worker watch asks every 20 ms instead of every 2 s
(``lifecycle.WATCH_INTERVAL_S``, read when a watch starts).
"""

from __future__ import annotations

import functools
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent.parent)
if TESTS not in sys.path:  # tests/conftest.py's directory: where `support` lives
    sys.path.insert(0, TESTS)

from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan  # noqa: E402
from mpilaunch.job import lifecycle  # noqa: E402
from support.fake_backend import CallLog, FakeBackend, FakeClusterBackend, Script  # noqa: E402
from support.fake_workload import FakeWorkload  # noqa: E402

WATCH_INTERVAL_S = 0.02
WORKERS = ("job-worker-0", "job-worker-1")


@dataclass
class FakeJob:
    log: CallLog
    backend: FakeBackend
    workload: FakeWorkload
    rundir: Path
    output_dir: Path
    stderr: io.StringIO
    result: object = None  # the JobResult, when run_job returned
    error: BaseException | None = None  # what run_job raised, when it raised

    @property
    def exit_code(self) -> int:
        return self.result.exit_code if self.error is None else self.error.exit_code

    def report(self) -> dict:
        return json.loads((self.output_dir / "report.json").read_text())


@pytest.fixture(autouse=True)
def fast_watch(monkeypatch):
    monkeypatch.setattr(lifecycle, "WATCH_INTERVAL_S", WATCH_INTERVAL_S)


@pytest.fixture
def make_plan():
    def make(job: str = "job") -> Plan:
        return Plan(job, tuple(WorkerPlan(name.replace("job", job, 1), 2, 0) for name in WORKERS))

    return make


@pytest.fixture
def run_fake(tmp_path, make_plan):
    def run(
        *outcomes,
        backend: Script | None = None,
        workload: Script | None = None,
        launcher_in_cluster: bool = False,
        raises: type | None = None,
        keep_records: int | None = None,
        environ: dict | None = None,
        **spec_options,
    ) -> FakeJob:
        spec = JobSpec(
            command=("python", "train.py"), np=4, name="job", output_dir=str(tmp_path / "out"), **spec_options
        )
        plan = make_plan()
        rundir = tmp_path / "rundir"
        rundir.mkdir()
        log = CallLog()
        if spec.retries or launcher_in_cluster:
            made = FakeClusterBackend(
                spec, plan, rundir, log=log, script=backend, launcher_in_cluster=launcher_in_cluster
            )
        else:
            made = FakeBackend(spec, plan, rundir, log=log, script=backend)
        job = FakeJob(
            log=log,
            backend=made,
            workload=FakeWorkload(spec, plan, outcomes, log=log, script=workload),
            rundir=rundir,
            output_dir=lifecycle.prepare_output_dir(spec),
            stderr=io.StringIO(),
        )
        call = functools.partial(
            lifecycle.run_job,
            spec,
            job.workload,
            job.backend,
            rundir,
            job.output_dir,
            stdout=io.StringIO(),
            stderr=job.stderr,
            environ=environ or {},
            quiet=False,
            keep_records=keep_records,
        )
        if raises is None:
            job.result = call()
        else:
            with pytest.raises(raises) as caught:
                call()
            job.error = caught.value
        return job

    return run
