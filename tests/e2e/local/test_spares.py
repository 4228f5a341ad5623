"""--spares on the local backend: agents beyond the plan wait outside the hostfile, and one takes the
place of a worker that ``--preflight enforce`` rejects or that is lost under ``--retries``, at once.

Real agents and Open MPI 5. The one thing faked: no GPU exists on the test machines, so a stand-in
``nvidia-smi`` on PATH reports three GPUs, some with uncorrected ECC errors (said so here, as the
project's rules ask); each worker and spare gets its own GPU, as on a real machine.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from support.helpers import agent_pid, leftover_processes, mpilaunch_env, run_mpilaunch, wait_started

pytestmark = pytest.mark.mpi

ATTEMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "programs", "attempts.py")
SAYS_WHERE = (
    sys.executable,
    "-c",
    "import os; print('RAN', os.environ['MPILAUNCH_WORKER'], os.environ['CUDA_VISIBLE_DEVICES'])",
)


def three_gpus(tmp_path, bad: set[int]) -> dict:
    """PATH with an ``nvidia-smi`` that reports GPUs 0-2, those in ``bad`` with ECC errors."""
    rows = "".join(
        f"{i}, NVIDIA H100 80GB HBM3, {3 if i in bad else 0}, 0x{'40' if i in bad else '00':0>16}\\n" for i in range(3)
    )
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\ncase \"$*\" in\n  *ecc*) printf '{rows}' ;;\n  *) printf '0\\n1\\n2\\n' ;;\nesac\n")
    smi.chmod(0o755)
    return {"PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}", "MPILAUNCH_STATE_DIR": str(tmp_path / "state")}


def report_of(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "report.json").read_text())


def test_spare_takes_the_place_of_a_worker_preflight_rejects_and_the_job_runs(openmpi5, tmp_path):
    job = "spare-pf"
    proc = run_mpilaunch(
        ["--name", job, "--gpus", "2", "--gpus-per-node", "1", "--spares", "1", "--preflight", "enforce",
         "--output-dir", str(tmp_path / "out"), "--", *SAYS_WHERE],
        openmpi5,
        env_extra=three_gpus(tmp_path, bad={1}),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # worker 1 (GPU 1) was rejected; the spare, with GPU 2, serves it under the worker's name
    assert sorted(line.split("] ", 1)[1] for line in proc.stdout.splitlines()) == [
        f"RAN {job}-worker-0 0",
        f"RAN {job}-worker-1 2",
    ], proc.stdout
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (preflight)" in proc.stderr
    assert "mpilaunch: preflight: 2 workers passed" in proc.stderr  # checked again, all of them
    report = report_of(tmp_path)
    assert [s["failed_workers"] for s in report["preflight"]["swapped_rounds"]] == [[f"{job}-worker-1"]]
    assert report["preflight"]["failed_workers"] == []
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        (f"{job}-worker-1", f"{job}-spare-0", "preflight")
    ]
    assert report["workers"][f"{job}-worker-1"]["spare"] == f"{job}-spare-0"
    assert report["workers"][f"{job}-worker-1"]["gpus"] == ["2"]
    assert leftover_processes(job) == []


def test_spare_found_bad_too_and_no_spare_left_enforce_stops_with_nothing_left(openmpi5, tmp_path):
    job = "spare-pf-out"
    proc = run_mpilaunch(
        ["--name", job, "--gpus", "2", "--gpus-per-node", "1", "--spares", "1", "--preflight", "enforce",
         "--output-dir", str(tmp_path / "out"), "--", *SAYS_WHERE],
        openmpi5,
        env_extra=three_gpus(tmp_path, bad={1, 2}),
    )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "RAN" not in proc.stdout
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (preflight)" in proc.stderr
    # the spare's own GPU is bad: named under the worker it serves, and no spare is left to swap in
    # (its host name is its own: the node it runs on is named)
    assert (
        f"preflight: worker {job}-worker-1 (node {job}-spare-0) GPU 2 (NVIDIA H100 80GB HBM3) has 3 unc" in proc.stderr
    )
    assert f"mpilaunch: error: preflight: 1 of 2 workers failed ({job}-worker-1)" in proc.stderr
    assert "  hint: 1 to swap, 0 spares waiting after 1 swap; see the 'mpilaunch: preflight:' lines" in proc.stderr
    report = report_of(tmp_path)
    assert report["exit_code"] == 6 and len(report["preflight"]["swapped_rounds"]) == 1
    assert leftover_processes(job) == []


def test_spare_takes_a_lost_workers_place_at_once_and_another_is_asked_for(openmpi5, tmp_path):
    job = "spare-lost"
    env = mpilaunch_env(PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"])
    argv = [
        sys.executable, "-m", "mpilaunch", "--name", job, "--np", "2", "--slots-per-worker", "1",
        "--retries", "1", "--spares", "1", "--output-dir", str(tmp_path / "out"),
        "-x", f"ATTEMPT_MARKER={tmp_path / 'marker'}", "--", sys.executable, ATTEMPTS,
    ]  # fmt: skip
    import subprocess

    proc = subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = wait_started(proc, 2, "started (first attempt)")
        spare = agent_pid(f"{job}-spare-0")  # waiting, outside the hostfile: no rank of the first attempt on it
        os.kill(agent_pid(f"{job}-worker-1"), signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 0, err[-3000:]
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (lost)" in err
    # the relaunched rank on the spare says the worker of the plan
    assert f"started (relaunch) on {job}-worker-1 as attempt 2" in out, out
    report = report_of(tmp_path)
    assert [a["lost_workers"] for a in report["attempts"]] == [[f"{job}-worker-1"], []]
    assert report["workers"][f"{job}-worker-1"]["pid"] == spare
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        (f"{job}-worker-1", f"{job}-spare-0", "lost")
    ]
    assert leftover_processes(job) == []  # the new spare (spare-1) was released with the job


def test_spare_agents_are_released_when_the_program_fails(openmpi5, tmp_path):
    job = "spare-fail"
    proc = run_mpilaunch(
        ["--name", job, "--np", "2", "--slots-per-worker", "1", "--spares", "2", "--retries", "1",
         "--", sys.executable, "-c", "import sys; sys.exit(3)"],
        openmpi5,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # a rank failure is no lost worker: no spare taken
    assert "takes the place" not in proc.stderr
    assert leftover_processes(job) == []


@pytest.mark.parametrize(
    "args, said",
    [
        (["--spares", "1"], "--spares needs something to swap a worker out"),
        (["--spares", "-1", "--retries", "1"], "--spares must be 0 or more, got -1"),
    ],
)
def test_spare_bad_options_get_one_line_and_exit_2(args, said):
    proc = run_mpilaunch(["--np", "2", *args, "--", "true"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"mpilaunch: error: {said}"), proc.stderr
