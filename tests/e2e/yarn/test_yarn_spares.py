"""--spares on YARN (a real ResourceManager and NodeManagers): the worker service has K instances
more than the plan, each a spare whose agent waits outside the hostfile; a worker lost under
--retries is served by a spare container at once, with no new container to wait for.
Both launchers: mpirun here, and the launcher container (which swaps the spare in itself and runs
mpirun again: no new launcher container)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from support.helpers import REPO, agent_pid, wait_started
from support.yarn import app_by_name, assert_released, container_processes, describe_app, proc_environ

pytestmark = [pytest.mark.mpi, pytest.mark.yarn]

PROGRAM = str(REPO / "tests/programs/attempts.py")  # absolute: YARN containers start elsewhere


def launcher_container(yarn, job: str) -> str | None:
    """The CONTAINER_ID of the job's launcher container's process (it runs on this machine)."""
    for pid in container_processes(app_by_name(yarn, job)["id"]):
        try:
            if "yarn.in_cluster.launcher" in " ".join(psutil.Process(pid).cmdline()):
                return proc_environ(pid).get("CONTAINER_ID")
        except psutil.Error:
            continue
    return None


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_yarn_spare_container_takes_the_place_of_a_lost_worker(yarn, openmpi_env, tmp_path, launcher):
    job = f"spare-yarn-{launcher}"
    argv = [
        sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--name", job, "--np", "2",
        "--slots-per-worker", "1", "--mpirun", openmpi_env["mpirun"], "--launcher", launcher,
        "--memory", "256 MiB", "--retries", "1", "--spares", "1", "--output-dir", str(tmp_path / "out"),
        "-x", f"ATTEMPT_MARKER={tmp_path / 'marker'}", "-x", f"RELAUNCH_GATE={tmp_path / 'gate'}",
        "--", sys.executable, PROGRAM,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env=openmpi_env["env"], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        seen = wait_started(proc, 2, "started (first attempt)", timeout=180, context=lambda: describe_app(yarn, job))
        spare_container = proc_environ(agent_pid(f"{job}-spare-0")).get("CONTAINER_ID")  # waiting beside the job
        first_launcher = launcher_container(yarn, job) if launcher == "cluster" else None
        os.kill(agent_pid(f"{job}-worker-1"), signal.SIGKILL)
        seen += wait_started(proc, 2, "started (relaunch)", timeout=180, context=lambda: describe_app(yarn, job))
        if launcher == "cluster":  # the relaunch runs from the same launcher container
            assert first_launcher and launcher_container(yarn, job) == first_launcher
        (tmp_path / "gate").touch()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(seen) + out
    assert proc.returncode == 0, err[-3000:]
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (lost)" in err, err[-3000:]
    assert f"started (relaunch) on {job}-worker-1 as attempt 2" in out, out  # the worker's name, from the spare
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(a["exit_code"], a["lost_workers"]) for a in report["attempts"]] == [(5, [f"{job}-worker-1"]), (0, [])]
    assert report["workers"][f"{job}-worker-1"]["container"] == spare_container
    assert report["workers"][f"{job}-worker-1"]["spare"] == f"{job}-spare-0"
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        (f"{job}-worker-1", f"{job}-spare-0", "lost")
    ]
    assert_released(yarn, job, "SUCCEEDED")


def test_yarn_spare_with_the_launcher_container_needs_retries(yarn, openmpi_env):
    argv = [
        sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--name", "spare-yarn-no", "--np", "2",
        "--launcher", "cluster", "--spares", "1", "--preflight", "enforce", "--", "true",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, env=openmpi_env["env"], text=True, capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mpilaunch: error: --spares with the launcher container serves --retries only")
