"""--spares on the ssh testbed: the hostfile's next hosts after the job's wait with an agent each, and
one takes the place of a host that ``--preflight enforce`` rejects or that is lost under ``--retries``.

Real sshd hosts (each its own network namespace and host name), Debian's Open MPI 4. The slow host
is made real as in test_ssh_preflight.py: its sshd, and every session forked from it, in a cgroup
with 5% of a core (tests/support/faults.py); the lost host's sshd sessions are SIGKILLed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from support.faults import slow_cpu
from support.helpers import REPO, wait_started
from support.ssh_jobs import OPENMPI4, PYTHON, assert_hosts_clean, hostfile, run, start

pytestmark = [pytest.mark.mpi, pytest.mark.ssh]

ATTEMPTS = str(REPO / "tests" / "programs" / "attempts.py")  # sleeps on the first attempt, succeeds on a relaunch


def report_of(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "report.json").read_text())


def ranks(stdout: str) -> list[dict]:
    """The allreduce's lines (one JSON object per rank), after the rank prefix."""
    return sorted((json.loads(line[line.index("{") :]) for line in stdout.splitlines() if '"rank"' in line), key=str)


def test_spare_host_takes_the_place_of_a_slow_host_preflight_rejects_and_the_job_runs(bed, tmp_path):
    hosts = hostfile(tmp_path, "node-1", "node-2", "node-3", slots=1)
    # 2% of a core: two workers' median is their mean, so the slow one must stand out by far even
    # when the machine is loaded (at 5%, under a full suite run, it once did not)
    with slow_cpu([bed.sshd_pid("node-2")], share_of_a_core=0.02):
        proc = run(
            bed, hosts, OPENMPI4, "--name", "spare-pf", "--np", "2", "--spares", "1", "--preflight", "enforce",
            "--output-dir", str(tmp_path / "out"), "--", *OPENMPI4.allreduce,
            timeout=180,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "mpilaunch: spare node-3 takes the place of worker node-2 (preflight)" in proc.stderr
    assert "mpilaunch: preflight: 2 workers passed" in proc.stderr  # checked again, with the spare
    # worker node-2's rank ran on host node-3, and says the plan's worker
    where = {(r["worker"], r["hostname"]) for r in ranks(proc.stdout)}
    assert where == {("node-1", "node-1"), ("node-2", "node-3")}, proc.stdout
    assert {r["sum"] for r in ranks(proc.stdout)} == {3}
    report = report_of(tmp_path)
    assert [s["failed_workers"] for s in report["preflight"]["swapped_rounds"]] == [["node-2"]]
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        ("node-2", "node-3", "preflight")
    ]
    assert report["workers"]["node-2"]["spare"] == "node-3"
    assert report["workers"]["node-2"]["host"] == "node-3"
    assert "spare" not in report["workers"]["node-1"]
    assert_hosts_clean(bed, timeout=15)  # node-2's session (at 5% of a core) ended at the swap


def test_spare_host_takes_a_lost_hosts_place_and_the_ranks_say_the_workers_name(bed, tmp_path):
    proc = start(
        bed, hostfile(tmp_path, "node-1", "node-2", "node-3", slots=1), OPENMPI4, "--name", "spare-lost",
        "--np", "2", "--retries", "1", "--spares", "1", "--output-dir", str(tmp_path / "out"),
        "--", PYTHON, ATTEMPTS,
    )  # fmt: skip
    try:
        seen = wait_started(proc, 2, "started (first attempt)", timeout=60)
        assert bed.kill_sessions("node-2")  # node-2's sshd sessions crash: its connection drops
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "mpilaunch: spare node-3 takes the place of worker node-2 (lost)" in stderr, stderr
    stdout = "".join(seen) + stdout
    # the relaunched rank, on node-3, says the plan's worker
    assert "unit 1 started (relaunch) on node-2 as attempt 2" in stdout, stdout
    assert stdout.count("as attempt 2") == 2, stdout
    report = report_of(tmp_path)
    assert [a["lost_workers"] for a in report["attempts"]] == [["node-2"], []]
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [("node-2", "node-3", "lost")]
    assert (report["workers"]["node-2"]["spare"], report["workers"]["node-2"]["host"]) == ("node-3", "node-3")
    assert_hosts_clean(bed)  # node-2's agent ended with its session, the others with the release


def test_spare_taken_is_refilled_from_the_hostfiles_next_host(bed, tmp_path):
    # --np 2 on 2 slots a host: the job takes node-1, node-2 is the spare, node-3 the one left to refill
    shared = Path(tempfile.mkdtemp(prefix="spare-refill-"))  # the hosts' login user reads no root's tmp_path
    shared.chmod(0o755)
    gate = shared / "gate"
    proc = start(
        bed, hostfile(tmp_path, "node-1", "node-2", "node-3", slots=2), OPENMPI4, "--name", "spare-refill",
        "--np", "2", "--retries", "1", "--spares", "1", "--output-dir", str(tmp_path / "out"),
        "-x", f"RELAUNCH_GATE={gate}", "--", PYTHON, ATTEMPTS,
    )  # fmt: skip
    try:
        wait_started(proc, 2, "started (first attempt)", timeout=60)
        assert not bed.processes("node-3")  # not asked for yet: one spare, node-2
        assert bed.kill_sessions("node-1")
        wait_started(proc, 2, "started (relaunch) on node-1 as attempt 2", timeout=60)
        # the relaunch runs on node-2, and node-3's agent waits as the new spare
        assert any("'mpilaunch-ssh'" in p and "python3" in p for p in bed.processes("node-3")), bed.processes("node-3")
        gate.touch()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        shutil.rmtree(shared)
    assert proc.returncode == 0, stderr
    assert "mpilaunch: spare node-2 takes the place of worker node-1 (lost)" in stderr, stderr
    assert "is not used" not in stderr
    assert report_of(tmp_path)["workers"]["node-1"]["host"] == "node-2"
    assert_hosts_clean(bed)


@pytest.mark.parametrize(
    "hosts, args, said",
    [
        (("node-1", "node-2"), ["--np", "2"], "--spares 1 needs 1 host of --hostfile beyond the 2 the job takes for --np 2, and "),
        (("node-1", "node-2", "node-3"), [], "--spares 1 needs 1 host of --hostfile beyond the 3 the job takes for no --np (every host)"),
    ],
)  # fmt: skip
def test_spare_hosts_too_few_in_the_hostfile_is_one_line_exit_2_before_anything_starts(
    bed, tmp_path, hosts, args, said
):
    proc = run(
        bed, hostfile(tmp_path, *hosts, slots=1), OPENMPI4, "--name", "spare-few", *args, "--spares", "1",
        "--retries", "1", "--", PYTHON, "-V",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"mpilaunch: error: {said}"), proc.stderr
    assert lines[1].startswith("  hint: add hosts to the hostfile (a spare is the next host after the job's)")
    assert_hosts_clean(bed)


def test_spare_host_ssh_cannot_reach_is_not_used_and_unused_spares_leave_nothing(bed, tmp_path):
    # the first spare does not resolve: said, and no failure; the second waits unused to the end
    hosts = hostfile(tmp_path, "node-1", "node-2", "no-such-host", "node-3", slots=1)
    proc = run(
        bed, hosts, OPENMPI4, "--name", "spare-unused", "--np", "2", "--spares", "2", "--retries", "1",
        "--output-dir", str(tmp_path / "out"), "--", *OPENMPI4.allreduce,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "mpilaunch: spare host no-such-host is not used: ssh exited with code 255: ssh: Could not resolve" in (
        proc.stderr
    ), proc.stderr
    assert {(r["worker"], r["hostname"]) for r in ranks(proc.stdout)} == {("node-1", "node-1"), ("node-2", "node-2")}
    report = report_of(tmp_path)
    assert report["spares"]["swaps"] == [] and not any("spare" in w for w in report["workers"].values())
    assert_hosts_clean(bed)  # node-3's waiting agent was released with the job
