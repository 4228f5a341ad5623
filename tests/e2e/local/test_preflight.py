"""--preflight on the local backend: the probe runs in every worker through its real agent.

No GPU exists on the test machines: a stand-in ``nvidia-smi`` on PATH reports two GPUs, the second
with uncorrected ECC errors and a thermal slowdown (the one thing faked, said so here, as the
project's rules ask). Everything else is real: agents, the exec channel, Open MPI 5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import leftover_processes, run_mpilaunch

pytestmark = pytest.mark.mpi

UNHEALTHY_SECOND_GPU = """#!/bin/sh
case "$*" in
  *ecc*) printf '0, NVIDIA H100 80GB HBM3, 0, 0x0000000000000000\\n1, NVIDIA H100 80GB HBM3, 3, 0x0000000000000040\\n' ;;
  *) printf '0\\n1\\n' ;;
esac
"""
PROGRAM = (sys.executable, "-c", "print('PROGRAM-RAN', flush=True)")


@pytest.fixture
def unhealthy_gpu(tmp_path) -> dict:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(UNHEALTHY_SECOND_GPU)
    smi.chmod(0o755)
    return {"PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}", "MPILAUNCH_STATE_DIR": str(tmp_path / "state")}


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: preflight:")]


def test_preflight_gpus_enforce_stops_before_the_program_with_nothing_left(openmpi5, unhealthy_gpu, tmp_path):
    proc = run_mpilaunch(
        ["--name", "pf-gpu", "--gpus", "2", "--gpus-per-node", "1", "--preflight", "enforce",
         "--output-dir", str(tmp_path / "out"), "--", *PROGRAM],
        openmpi5,
        env_extra=unhealthy_gpu,
    )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "PROGRAM-RAN" not in proc.stdout
    # a local worker's host name is its own (its UTS namespace): no node is named beside it
    assert preflight_lines(proc.stderr) == [
        "mpilaunch: preflight: worker pf-gpu-worker-1 GPU 1 (NVIDIA H100 80GB HBM3) has 3 uncorrected ECC errors",
        "mpilaunch: preflight: worker pf-gpu-worker-1 GPU 1 (NVIDIA H100 80GB HBM3) is throttled: HW thermal slowdown",
    ]
    assert "mpilaunch: error: preflight: 1 of 2 workers failed (pf-gpu-worker-1)" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["exit_code"] == 6 and report["preflight"]["failed_workers"] == ["pf-gpu-worker-1"]
    assert [f["check"] for f in report["preflight"]["findings"]] == ["gpus", "gpus"]
    assert leftover_processes("pf-gpu") == []


def test_preflight_report_names_the_worker_and_runs_the_job_anyway(openmpi5, unhealthy_gpu):
    proc = run_mpilaunch(
        ["--name", "pf-rep", "--gpus", "2", "--gpus-per-node", "1", "--preflight", "report", "--", *PROGRAM],
        openmpi5,
        env_extra=unhealthy_gpu,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("PROGRAM-RAN") == 2
    assert len(preflight_lines(proc.stderr)) == 2 and all("pf-rep-worker-1" in x for x in preflight_lines(proc.stderr))
    (kept,) = Path(unhealthy_gpu["MPILAUNCH_STATE_DIR"]).rglob("report.json")  # the job's record
    record = json.loads(kept.read_text())
    assert record["preflight"]["mode"] == "report" and record["preflight"]["failed_workers"] == ["pf-rep-worker-1"]
    assert leftover_processes("pf-rep") == []


def test_preflight_report_a_healthy_job_passes_and_keeps_every_workers_figures(openmpi5, tmp_path):
    proc = run_mpilaunch(
        ["--name", "pf-ok", "--np", "4", "--slots-per-worker", "1", "--preflight", "report",
         "--output-dir", str(tmp_path), "--", *PROGRAM],
        openmpi5,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = preflight_lines(proc.stderr)
    assert line.startswith("mpilaunch: preflight: 4 workers passed in "), line
    report = json.loads((tmp_path / "report.json").read_text())
    figures = report["preflight"]["workers"]
    assert sorted(figures) == [f"pf-ok-worker-{i}" for i in range(4)]
    assert all(f["kernel_s"] > 0 and f["scratch_free"] > 0 for f in figures.values())
    assert "preflight_done" in report["timings"]["phases"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs as the workers' TMPDIR: needs root")
def test_preflight_scratch_a_full_tmpdir_is_named(openmpi5, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        proc = run_mpilaunch(
            ["--name", "pf-tmp", "--np", "2", "--slots-per-worker", "1", "--preflight", "enforce", "--", *PROGRAM],
            openmpi5,
            env_extra={"TMPDIR": str(small)},
        )
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert proc.returncode == 6, proc.stderr
    lines = preflight_lines(proc.stderr)
    assert len(lines) == 2, proc.stderr
    for i, line in enumerate(lines):  # each local worker has a TMPDIR of its own in the given one
        head = f"mpilaunch: preflight: worker pf-tmp-worker-{i} scratch {small}/mpilaunch-pf-tmp-worker-{i}-"
        assert line.startswith(head) and line.endswith(" free, under 1.00 GiB"), line
        amount = line.split(" has ", 1)[1].split(" free", 1)[0]
        assert amount.endswith(" MiB") and float(amount[:-4]) <= 64.0, line
    assert leftover_processes("pf-tmp") == []


def test_preflight_link_test_runs_under_each_mpi_with_its_own_library(mpi_install, tmp_path):
    """The link test is a real MPI program under the job's own mpirun: one rank per worker, each
    ring link timed alone, then an allreduce, through ctypes on the MPI library that mpirun belongs
    with (Open MPI 5 from PyPI beside Debian's Open MPI 4 library, MPICH's and Intel MPI's ABI)."""
    name = f"pf-links-{mpi_install.id}"
    proc = run_mpilaunch(
        ["--name", name, "--np", "4", "--slots-per-worker", "1", "--preflight", "report",
         "--output-dir", str(tmp_path / "out"), "--", *PROGRAM],
        mpi_install,
        env_extra={"MPILAUNCH_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("PROGRAM-RAN") == 4
    report = json.loads((tmp_path / "out" / "report.json").read_text())["preflight"]
    assert report["medians"]["link_gbps"] > 0 and report["medians"]["allreduce_s"] > 0, report
    for i in range(4):
        measured = report["workers"][f"{name}-worker-{i}"]
        assert measured["link_in_gbps"] > 0 and measured["link_out_gbps"] > 0, report
    # a healthy machine: no finding, or (on a loaded one) only the link test's, never a failure of it
    assert not [f for f in report["findings"] if "took no part" in f["message"]], report
    assert leftover_processes(name) == []
