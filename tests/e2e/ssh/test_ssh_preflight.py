"""--preflight on the ssh testbed's hosts (real sshd hosts, each its own network namespace).

A slow node is made real: one host's sshd (and every session forked from it) runs in a cgroup
with 5% of a core (tests/support/faults.py). The preflight must name that host's worker, with its
numbers, before the program starts; with ``enforce`` the job ends there, with nothing left.
"""

from __future__ import annotations

import json

import pytest

from support.faults import slow_cpu, slow_link
from support.ssh_jobs import OPENMPI4, assert_hosts_clean, hostfile, run

pytestmark = [pytest.mark.mpi, pytest.mark.ssh]


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: preflight:")]


def test_preflight_slow_node_is_named_and_enforce_stops_before_the_program(bed, tmp_path):
    hosts = hostfile(tmp_path, "node-1", "node-2", "node-3", slots=1)
    with slow_cpu([bed.sshd_pid("node-2")], share_of_a_core=0.05):
        proc = run(
            bed, hosts, OPENMPI4, "--name", "pf-slow", "--preflight", "enforce", "--output-dir", str(tmp_path / "out"),
            "--", "/bin/echo", "PROGRAM-RAN",
        )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "PROGRAM-RAN" not in proc.stdout
    lines = preflight_lines(proc.stderr)
    # ssh: a worker is its host; its link test ranks are starved too, so its links may be named as well
    assert {line.split(" ")[3] for line in lines} == {"node-2"}, lines
    (line,) = [line for line in lines if " compute kernel " in line]
    assert line.startswith("mpilaunch: preflight: worker node-2 compute kernel "), line
    assert "median" in line and "over the 50% margin" in line
    assert "mpilaunch: error: preflight: 1 of 3 workers failed (node-2)" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["preflight"]["failed_workers"] == ["node-2"]
    slow = report["preflight"]["workers"]["node-2"]["kernel_s"]
    assert slow > 1.5 * report["preflight"]["medians"]["kernel_s"]
    assert_hosts_clean(bed)


def test_preflight_report_on_healthy_hosts_names_no_one_and_runs_the_job(bed, tmp_path):
    proc = run(
        bed, hostfile(tmp_path, "node-1", "node-3", slots=1), OPENMPI4, "--name", "pf-ok", "--preflight", "report",
        "--", "/bin/echo", "PROGRAM-RAN",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("PROGRAM-RAN") == 2
    (line,) = preflight_lines(proc.stderr)
    assert line.startswith("mpilaunch: preflight: 2 workers passed in "), line
    assert_hosts_clean(bed)


def test_preflight_slow_link_is_named_by_the_link_test_with_its_rate(bed, tmp_path):
    """One host's link limited to 20 Mbit/s both ways (a token bucket on its veth): the link test
    under the job's own Open MPI names that worker with both of its ring links' rates against the
    median, and report mode still runs the program."""
    names = ["node-1", "node-2", "node-3"]
    with slow_link(bed, "node-3", "20mbit"):
        proc = run(
            bed, hostfile(tmp_path, *names, slots=1), OPENMPI4, "--name", "pf-link", "--preflight", "report",
            "--output-dir", str(tmp_path / "out"), "--", "/bin/echo", "PROGRAM-RAN",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("PROGRAM-RAN") == 3
    lines = preflight_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("mpilaunch: preflight: worker node-3 ring links "), lines
    assert " GB/s in, " in lines[0] and "median" in lines[0], lines[0]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    figures = report["preflight"]["workers"]
    slow = figures["node-3"]["link_in_gbps"]
    assert slow < 0.01, figures  # 20 Mbit/s is 0.0025 GB/s
    assert report["preflight"]["medians"]["link_gbps"] > 10 * slow
    assert report["preflight"]["medians"]["allreduce_s"] > 0
    assert_hosts_clean(bed)
