"""The ssh backend end to end: real sshd hosts, real MPI, the real command line.

The hosts are ``testbeds/ssh``: each one a network namespace with an address,
a host name and an OpenSSH sshd of its own, logged into as ``mpilaunch-user``
where that user exists (else root). mpilaunch runs here as root with
Debian's Open MPI 4.1 and MPICH 4.0 (system-wide, so the unprivileged
user's daemons and ranks find them on every host); the ranks run Debian's
python3, with the MPI library through ctypes (that user cannot reach root's
mpi4py builds, nor the venv's Open MPI 5 and Intel MPI). Nothing of mpilaunch
is installed on the hosts: the backend sends it over each ssh session.

After every job, whatever its end, each host must be as it was: no process
besides its sshd (no agent, daemon, rank or sshd session) and an empty
TMPDIR.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil
import pytest

from support.helpers import REPO, leftover_processes, mpilaunch_env, wait_for, wait_started
from support.mpi_installs import require

pytestmark = [pytest.mark.mpi, pytest.mark.ssh]

PYTHON = "/usr/bin/python3"  # Debian's, on every host: the same program here and there (environment check)
FAIL_RANK = str(REPO / "tests" / "programs" / "fail_rank.py")
ATTEMPTS = str(REPO / "tests" / "programs" / "attempts.py")  # sleeps on the first attempt, succeeds on a relaunch
# An allreduce through Open MPI's library, no mpi4py; each rank says where it ran, as whom.
OPENMPI_ALLREDUCE = """
import ctypes, json, os, socket
lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
lib.MPI_Init(None, None)
world, mpi_int, mpi_sum = (ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, n)))
                           for n in ("ompi_mpi_comm_world", "ompi_mpi_int", "ompi_mpi_op_sum"))
rank, size, total = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
lib.MPI_Comm_rank(world, ctypes.byref(rank))
lib.MPI_Comm_size(world, ctypes.byref(size))
lib.MPI_Allreduce(ctypes.byref(ctypes.c_int(rank.value + 1)), ctypes.byref(total), 1, mpi_int, mpi_sum, world)
print(json.dumps({"rank": rank.value, "size": size.value, "sum": total.value, "uid": os.getuid(),
                  "worker": os.environ.get("MPILAUNCH_WORKER"), "hostname": socket.gethostname(),
                  "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")]}), flush=True)
lib.MPI_Finalize()
"""


@dataclass(frozen=True)
class Flavour:
    id: str
    mpirun: str
    allreduce: tuple[str, ...]  # the rank program: an allreduce that prints one JSON line per rank


FLAVOURS = {
    "openmpi4": Flavour("openmpi4", "/usr/bin/mpirun.openmpi", (PYTHON, "-c", OPENMPI_ALLREDUCE)),
    # MPICH's hydra: its proxies connect back to mpiexec (the backend's control address)
    "mpich": Flavour("mpich", "/usr/bin/mpiexec.hydra", (PYTHON, str(REPO / "tests/programs/ctypes_allreduce.py"))),
}


@pytest.fixture(params=list(FLAVOURS))
def flavour(request) -> Flavour:
    chosen = FLAVOURS[request.param]
    if not os.access(chosen.mpirun, os.X_OK):
        require(f"{chosen.mpirun} not installed (Debian's openmpi-bin / mpich)")
    return chosen


OPENMPI4 = FLAVOURS["openmpi4"]
MPILAUNCH = (sys.executable, "-m", "mpilaunch")


def argv(bed, hostfile, mpi: Flavour, *args) -> list[str]:
    return [
        *MPILAUNCH,
        "--backend",
        "ssh",
        "--ssh-command",
        bed.ssh_command,
        "--hostfile",
        str(hostfile),
        "--mpirun",
        mpi.mpirun,
        *args,
    ]


def hostfile(tmp_path, *hosts, slots=2):
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{host} slots={slots}\n" for host in hosts))
    return path


def run(bed, hostfile, mpi: Flavour, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv(bed, hostfile, mpi, *args), cwd=REPO, env=mpilaunch_env(), capture_output=True, text=True, timeout=timeout
    )


def start(bed, hostfile, mpi: Flavour, *args) -> subprocess.Popen:
    return subprocess.Popen(
        argv(bed, hostfile, mpi, *args),
        cwd=REPO,
        env=mpilaunch_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def assert_hosts_clean(bed, timeout: float = 5) -> None:
    """Every host as before the job: its sshd alone (no session, agent, daemon or rank), an empty TMPDIR.
    The job's release waited for each ssh to exit; a host's sshd may still be closing its side."""
    left = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {host: bed.leftovers(host) for host in bed.hosts if bed.leftovers(host)}
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"left on the hosts: {left}")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: error:")]


def test_ranks_run_on_their_planned_hosts(bed, tmp_path, flavour):
    out = tmp_path / "out"
    proc = run(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        flavour,
        "--name",
        f"ssh-ok-{flavour.id}",
        "--output-dir",
        str(out),
        "-q",
        "--",
        *flavour.allreduce,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = sorted(
        (json.loads(line[line.index("{") :]) for line in proc.stdout.splitlines() if '"rank"' in line),
        key=lambda r: r["rank"],
    )
    assert [r["sum"] for r in ranks] == [10] * 4  # one MPI job across both hosts
    # each rank in its planned host's agent (worker) and in that host's namespace (its own host name)
    assert [(r["worker"], r["hostname"]) for r in ranks] == [("node-1", "node-1")] * 2 + [("node-2", "node-2")] * 2
    report = json.loads((out / "report.json").read_text())
    assert report["placement"]["verified"] is True and report["placement"]["mismatch"] is None
    assert report["placement"]["workers"] == {
        "node-1": {"planned_slots": 2, "ranks": [0, 1]},
        "node-2": {"planned_slots": 2, "ranks": [2, 3]},
    }
    workers = report["workers"]
    assert {name: facts["host"] for name, facts in workers.items()} == {"node-1": "node-1", "node-2": "node-2"}
    assert workers["node-2"]["address"].startswith(bed.addresses["node-2"] + ":")
    assert_hosts_clean(bed)


def test_the_ranks_run_as_the_login_user_and_meet_on_the_first_host(bed, tmp_path):
    proc = run(
        bed, hostfile(tmp_path, "node-2", "node-3"), OPENMPI4, "--name", "ssh-uid", "-q", "--", *OPENMPI4.allreduce
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads(line[line.index("{") :]) for line in proc.stdout.splitlines() if '"rank"' in line]
    assert {r["uid"] for r in ranks} == {pwd.getpwnam(bed.user).pw_uid}  # mpilaunch is root here, not there
    # torch.distributed's rendezvous: node-2's address and a port its agent found free there
    ((address, port),) = {tuple(r["master"]) for r in ranks}
    assert address == bed.addresses["node-2"] and port.isdigit()
    assert_hosts_clean(bed)


def test_a_failing_rank_is_named_with_its_host(bed, tmp_path, flavour):
    # -x: a host's ranks get this machine's variables as a cluster's do, from mpirun (local agents inherit them)
    proc = run(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        flavour,
        "--name",
        f"ssh-fail-{flavour.id}",
        "-q",
        "-x",
        "FAIL_RANK=2",
        "-x",
        "FAIL_CODE=9",
        "--",
        PYTHON,
        FAIL_RANK,
    )
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert error_lines(proc.stderr)[0] == "mpilaunch: error: rank 2 on worker node-2 exited with code 9", proc.stderr
    assert "rank 2 about to fail" in proc.stderr  # the failing rank's last lines, from node-2
    assert_hosts_clean(bed)


def job_secret(job: str) -> str:
    """The running job's secret, from its run directory on this machine."""
    import glob
    import tempfile

    found = glob.glob(os.path.join(tempfile.gettempdir(), f"mpilaunch-{job}-*", "secret"))
    assert len(found) == 1, found
    with open(found[0]) as f:
        return f.read().strip()


def assert_secret_in_no_argv(secret: str) -> None:
    """Here and on every host (one pid namespace): no command line holds the job's secret."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        assert secret not in " ".join(p.info["cmdline"] or []), p.info


def test_ctrl_c_leaves_nothing_on_any_host(bed, tmp_path):
    proc = start(
        bed,
        hostfile(tmp_path, "node-1", "node-2", "node-3", slots=1),
        OPENMPI4,
        "--name",
        "ssh-int",
        "-x",
        "FAIL_RANK=-1",
        "--",
        PYTHON,
        FAIL_RANK,
    )  # no rank fails: they wait to be killed
    try:
        wait_started(proc, 3, timeout=60)
        assert_secret_in_no_argv(job_secret("ssh-int"))
        for host in bed.hosts:  # a rank runs on each host, as the unprivileged user
            assert any(FAIL_RANK in p for p in bed.processes(host)), bed.processes(host)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, proc.stderr.read()
    assert_hosts_clean(bed)


def test_a_killed_mpilaunch_leaves_nothing_on_any_host(bed, tmp_path):
    # SIGKILL: no cleanup of mpilaunch's own runs. Its end of each ssh's stdin closes with it, each host's
    # agent sees the end and ends what it ran; mpirun and the shims here follow their daemons
    proc = start(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        OPENMPI4,
        "--name",
        "ssh-kill",
        "-x",
        "FAIL_RANK=-1",
        "--",
        PYTHON,
        FAIL_RANK,
    )
    try:
        wait_started(proc, 4, timeout=60)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert_hosts_clean(bed, timeout=10)
    assert wait_for(lambda: not leftover_processes("ssh-kill"), 10, "mpirun and the shims to end") is True


def test_a_host_whose_ssh_session_dies_is_a_lost_worker(bed, tmp_path, flavour):
    out = tmp_path / "out"
    proc = start(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        flavour,
        "--name",
        f"ssh-lost-{flavour.id}",
        "--output-dir",
        str(out),
        "-x",
        "FAIL_RANK=-1",
        "--",
        PYTHON,
        FAIL_RANK,
    )
    try:
        wait_started(proc, 4, timeout=60)
        assert bed.kill_sessions("node-2")  # node-2's sshd session crashes: the connection drops
        proc.wait(timeout=60)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 5, stderr
    first = error_lines(stderr)[0]
    assert first.startswith("mpilaunch: error: worker node-2 (agent pid "), stderr
    assert (
        f" on node-2) was lost: its ssh session exited with code 255 (Connection to {bed.addresses['node-2']} "
        "closed by remote host.); ranks 2-3 ran there"
    ) in first, first
    report = json.loads((out / "report.json").read_text())
    assert report["lost_workers"] == ["node-2"] and report["exit_code"] == 5
    assert_hosts_clean(bed)  # node-2's agent saw its session end and ended its ranks; node-1's was released


def test_retries_give_a_lost_host_a_new_session_and_relaunch(bed, tmp_path):
    out = tmp_path / "out"
    proc = start(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        OPENMPI4,
        "--name",
        "ssh-retry",
        "--retries",
        "1",
        "--output-dir",
        str(out),
        "--",
        PYTHON,
        ATTEMPTS,
    )
    try:
        seen = wait_started(proc, 4, "started (first attempt)", timeout=60)
        assert bed.kill_sessions("node-2")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "mpilaunch: attempt 2 of 2: relaunching replacing node-2 (attempt 1: worker node-2" in stderr, stderr
    stdout = "".join(seen) + stdout
    assert stdout.count("started (relaunch)") == stdout.count("as attempt 2") == 4, stdout
    report = json.loads((out / "report.json").read_text())
    first, second = report["attempts"]
    assert (first["exit_code"], first["lost_workers"]) == (5, ["node-2"])
    assert (second["exit_code"], second["lost_workers"]) == (0, [])
    # each host's phases (the timeline's rows): the replaced session's kept as attempt 1's, then its own
    seen = report["timings"]["workers"]
    assert list(seen["node-1"]) == ["created", "ready"], seen
    assert list(seen["node-2"]) == ["created#1", "ready#1", "created", "ready"], seen
    assert seen["node-2"]["ready#1"] < second["started_s"] <= seen["node-2"]["created"] < seen["node-2"]["ready"], seen
    assert_hosts_clean(bed)  # the replaced session's agent ended with it, the new ones with the release


def test_a_host_behind_a_pulled_cable_is_a_lost_worker(bed, tmp_path):
    # the host answers nothing at all: ssh's keepalive (mpilaunch's default ServerAliveInterval=10,
    # CountMax=3; here 1 and 2 for speed) is what notices
    proc = start(
        bed,
        hostfile(tmp_path, "node-1", "node-2"),
        OPENMPI4,
        "--name",
        "ssh-cable",
        "--ssh-option",
        "ServerAliveInterval=1",
        "--ssh-option",
        "ServerAliveCountMax=2",
        "-x",
        "FAIL_RANK=-1",
        "--",
        PYTHON,
        FAIL_RANK,
    )
    try:
        wait_started(proc, 4, timeout=60)
        bed.unplug("node-2")
        proc.wait(timeout=60)
    finally:
        proc.kill()
        bed.plug("node-2")
    stderr = proc.stderr.read()
    assert proc.returncode == 5, stderr
    assert (
        f" on node-2) was lost: its ssh session exited with code 255 (Timeout, server {bed.addresses['node-2']} "
        "not responding.); ranks 2-3 ran there"
    ) in error_lines(stderr)[0], stderr
    # node-2's sshd gives its silent client up (ClientAliveInterval), and the agent ends with the session
    assert_hosts_clean(bed, timeout=15)


# How each case ends: the options that bound it, and the error line's end.
UNREACHABLE = {
    # ssh's own answer: the name resolves nowhere
    "unknown": (
        [],
        "ssh exited with code 255 before mpilaunch's agent started there: ssh: Could not resolve hostname no-such-host",
    ),
    # its cable pulled: ssh gives up after --ssh-option's ConnectTimeout (before the testbed config's 10 s)
    "unplugged": (
        ["--ssh-option", "ConnectTimeout=2"],
        "ssh exited with code 255 before mpilaunch's agent started there: ssh: connect to host ",
    ),
    # ... or mpilaunch does, at --start-timeout
    "silent": (["--start-timeout", "2"], "did not start mpilaunch's agent within --start-timeout 2s"),
}


@pytest.mark.parametrize("case", list(UNREACHABLE))
def test_a_host_ssh_cannot_reach_fails_the_allocation(bed, tmp_path, case):
    options, expected = UNREACHABLE[case]
    host = "no-such-host" if case == "unknown" else "node-3"
    if host == "node-3":
        bed.unplug(host)
    try:
        proc = run(
            bed,
            hostfile(tmp_path, "node-1", host),
            OPENMPI4,
            "--name",
            f"ssh-{case}",
            "-q",
            *options,
            "--",
            PYTHON,
            "-V",
        )
    finally:
        if host == "node-3":
            bed.plug(host)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("  hint: check that `ssh -F "), proc.stderr
    assert lines[0].startswith(f"mpilaunch: error: host {host}") and expected in lines[0], lines[0]
    assert_hosts_clean(bed)  # node-1's agent had started: released


def test_the_ssh_backend_needs_a_hostfile():
    proc = subprocess.run(
        [*MPILAUNCH, "--backend", "ssh", "--np", "2", "--", PYTHON, "-V"],
        cwd=REPO,
        env=mpilaunch_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mpilaunch: error: the ssh backend runs on the hosts of --hostfile"), proc.stderr
    assert "\n  hint: write one 'HOST slots=N' line per host" in proc.stderr


def test_collect_files_ssh_after_a_failed_rank(bed, tmp_path):
    """--collect on ssh hosts: the files come back through each host's agent before the sessions
    end, also after a rank failed. The hosts share this machine's file system (network namespaces):
    each lists the one directory, under its own name. The ranks run as the bed's login user: the
    directory is one that user can write."""
    shared = tempfile.mkdtemp(prefix="mpilaunch-collect-ssh-")
    os.chmod(shared, 0o777)
    out = tmp_path / "out"
    rank = "$OMPI_COMM_WORLD_RANK"
    try:
        proc = run(
            bed,
            hostfile(tmp_path, "node-1", "node-2"),
            OPENMPI4,
            "--name",
            "ssh-collect",
            "-q",
            "--output-dir",
            str(out),
            "--collect",
            f"{shared}/rank-*.txt",
            "--",
            "/bin/sh",
            "-c",
            f'echo "rank {rank} on $MPILAUNCH_WORKER" > {shared}/rank-{rank}.txt; [ {rank} = 2 ] && exit 9; sleep 30',
        )
        assert proc.returncode == 9, proc.stdout + proc.stderr
        assert [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: collect:")] == []
        written = sorted(os.listdir(shared))
        assert "rank-2.txt" in written, proc.stderr
        files = out / "files"
        got = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())
        assert got == sorted(f"{host}{shared}/{name}" for host in ("node-1", "node-2") for name in written), got
        assert (files / f"node-2{shared}" / "rank-2.txt").read_text() == "rank 2 on node-2\n"
        assert json.loads((out / "report.json").read_text())["collected"]["files"] == len(got)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert_hosts_clean(bed)
