"""Real MPI jobs through the shim and the exec agents on the local backend.

Each flavour (Open MPI 5 from PyPI, Open MPI 4.1 and MPICH 4.0 from Debian)
runs a real mpi4py allreduce; every rank must report the worker the hostfile
assigned it, which only an exec agent sets.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from support.helpers import REPO, leftover_processes, mpilaunch_env, run_mpilaunch, wait_for

pytestmark = pytest.mark.mpi


def json_lines(text):
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if start >= 0:
            try:
                out.append(json.JSONDecoder().raw_decode(line[start:])[0])
            except ValueError:
                pass
    return out


def test_allreduce_each_rank_on_its_assigned_worker(mpi_install, tmp_path):
    name = f"place-{mpi_install.id}"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "tests/programs/placement.py",
        ],
        mpi_install,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = sorted(json_lines(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["sum"] for r in ranks} == {10}
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2
    assert all(r["library"].startswith(mpi_install.library) for r in ranks), ranks[0]["library"]
    # Two workers = two distinct agent sessions (one daemon per worker).
    assert len({r["session"] for r in ranks}) == 2
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 0
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0, 0, 0]
    assert {"allocate_s", "run_s", "total_s"} <= set(report["timings"])
    # the same launch phases as on Kubernetes, less the pods' own
    phases = report["timings"]["phases"]
    order = [
        "allocated",
        "workers_ready",
        "mpirun_started",
        "first_rank_start",
        "first_output",
        "ranks_done",
        "workload_done",
        "released",
    ]
    assert list(phases) == order, phases  # earliest first
    assert (tmp_path / "rank-3.log").read_text().count('"rank": 3') == 1
    assert leftover_processes(name) == []


def test_rank_exit_code_propagates_and_names_the_rank(mpi_install, tmp_path):
    name = f"fail-{mpi_install.id}"
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        mpi_install,
        env_extra={"FAIL_RANK": "3", "FAIL_CODE": "7"},
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert f"rank 3 on worker {name}-worker-1 exited with code 7" in proc.stderr
    assert "rank 3 about to fail" in proc.stderr  # the failing rank's last lines
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 7
    assert report["ranks"][3]["exit_code"] == 7
    assert leftover_processes(name) == []


def test_every_rank_that_failed_by_itself_is_named(openmpi5, tmp_path):
    """Two ranks fail on their own: the summary names the first and, on the next line, the other;
    the two that mpirun ended after the failure (exit 143) are not called failures.
    Both status lines must arrive: Open MPI 5's daemon dropped a reaped rank's last line under load
    (the wrapper's linger is what keeps it)."""
    name = "fail-two"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        openmpi5,
        env_extra={"FAIL_RANK": "0,3", "FAIL_CODE": "7", "FAIL_BARRIER": str(barrier)},
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("mpilaunch: error: "))
    named_first = 0 if lines[first].endswith(f"rank 0 on worker {name}-worker-0 exited with code 7") else 3
    assert lines[first].endswith(f"rank {named_first} on worker {name}-worker-{named_first // 2} exited with code 7"), (
        lines[first]
    )
    other = 3 - named_first
    assert lines[first + 1] == f"also failed: rank {other} on {name}-worker-{other // 2} (exit 7)", proc.stderr
    assert leftover_processes(name) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_no_process_behind(openmpi5, sig):
    name = f"sig-{sig.name.lower()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        cwd=REPO,
        env=mpilaunch_env(openmpi5, FAIL_RANK="-1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = 0
    deadline = time.monotonic() + 90
    while started < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        started += "started" in line
    assert started == 4, "ranks did not start"
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == 130
    assert leftover_processes(name) == []


def test_a_reader_that_goes_away_does_not_cut_the_job_short(openmpi5, tmp_path):
    # `mpilaunch ... | head -1`: the echo to the closed pipe stops, but every
    # line still reaches the rank logs, the job ends normally and says so.
    # (Before: a BrokenPipeError traceback, rank-0.log cut at ~135 lines and
    # no rank-1.log at all.)
    lines = 20000
    name = "closed-reader"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "--np",
            "2",
            "-q",
            "--output-dir",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            f"for i in range({lines}): print('line', i)",
        ],
        cwd=REPO,
        env=mpilaunch_env(openmpi5),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().endswith(" line 0\n")
    proc.stdout.close()  # the reader goes away, as `head -1` does
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    for rank in (0, 1):
        log = (tmp_path / f"rank-{rank}.log").read_text().splitlines()
        assert log == [f"line {i}" for i in range(lines)], (rank, len(log))
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 0
    assert leftover_processes(name) == []


def test_sigkill_of_mpilaunch_leaves_no_process_behind(openmpi5):
    """SIGKILL runs no cleanup code: the agents end themselves (--exit-with-pid), and mpirun,
    the shims and every rank follow within seconds. No reaper or heartbeat is needed locally."""

    name = "sigkill-local"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        cwd=REPO,
        env=mpilaunch_env(openmpi5, FAIL_RANK="-1", SLEEP="300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = 0
    deadline = time.monotonic() + 90
    while started < 4 and time.monotonic() < deadline:
        started += "started" in proc.stdout.readline()
    assert started == 4, "ranks did not start"
    assert len(leftover_processes(name)) >= 6  # agents, mpirun, ranks
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    t0 = time.monotonic()
    wait_for(
        lambda: leftover_processes(name) == [],
        10,
        "every process of the job to end after SIGKILL",
        detail=lambda: "\n".join(leftover_processes(name)),
    )
    print(f"sigkill-local: all processes gone {time.monotonic() - t0:.1f}s after SIGKILL")


def test_timeout_stops_the_job_and_cleans_up(openmpi5):
    name = "timeout-job"
    t0 = time.monotonic()
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--timeout",
            "5",
            "-q",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        openmpi5,
        env_extra={"FAIL_RANK": "-1"},
    )
    assert proc.returncode == 124, proc.stderr
    assert "--timeout" in proc.stderr
    assert time.monotonic() - t0 < 60
    assert leftover_processes(name) == []


def test_python_api_returns_per_rank_status(openmpi5, monkeypatch):
    import mpilaunch

    for k, v in mpilaunch_env(openmpi5).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    result = mpilaunch.run([sys.executable, "-c", "pass"], np=2, slots_per_worker=1, name="api-job")
    assert result.exit_code == 0 and result.ok
    assert [(r.rank, r.exit_code) for r in result.ranks] == [(0, 0), (1, 0)]
    assert [r.worker for r in result.ranks] == ["api-job-worker-0", "api-job-worker-1"]
    assert result.timings["run_s"] > 0


def test_large_allreduce_between_workers(mpi_install):
    """8 MiB allreduces across two workers of one machine.

    Regression: two workers sharing /dev/shm segment names crashed Open MPI 4
    (vader), and Open MPI 5's coll/han misread the shared host and segfaulted
    in the TCP BTL; the agents now isolate both.
    """
    program = (
        "from array import array; from mpi4py import MPI; c = MPI.COMM_WORLD; n = 1 << 20; "
        "s = array('d', [c.rank + 1.0]) * n; r = array('d', bytes(8 * n)); "
        "c.Allreduce(s, r, op=MPI.SUM); assert r[0] == r[-1] == c.size * (c.size + 1) / 2; "
        "print('BIG OK', c.rank, flush=True)"
    )
    proc = run_mpilaunch(
        ["-q", "--np", "4", "--slots-per-worker", "2", "--", sys.executable, "-c", program], mpi_install
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("BIG OK") == 4


def test_shared_memory_split_groups_the_ranks_of_each_worker(mpi_install):
    """MPI_COMM_TYPE_SHARED groups exactly the ranks of one worker, the same on every rank.

    Regression (issue 48): Open MPI 5 knows a node by its daemon's host name, and two local
    workers' daemons had this machine's; every rank was told that ranks 2 and 3 shared its node
    (groups [0, 2, 3], [1, 2, 3], [2, 3], [2, 3]) and Horovod's MPI controller hung in hvd.init().
    Under Open MPI 5 each worker's agent now runs under its worker's name, which resolves there
    (agent/hostname.py); the other MPIs keep this machine's host name."""
    proc = run_mpilaunch(
        [
            "-q",
            "--timeout",
            "60",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--",
            sys.executable,
            "tests/programs/shared_split.py",
        ],
        mpi_install,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ranks = sorted(
        (json.loads(line.split("SHARED ", 1)[1]) for line in proc.stdout.splitlines() if "SHARED {" in line),
        key=lambda r: r["rank"],
    )
    assert [(r["rank"], r["group"]) for r in ranks] == [(0, [0, 1]), (1, [0, 1]), (2, [2, 3]), (3, [2, 3])], ranks
    if mpi_install.id == "openmpi5":
        # the worker's name, which resolves in the worker (Horovod's Gloo controller binds to it)
        assert [(r["hostname"], r["address"]) for r in ranks] == [(r["worker"], "127.0.1.1") for r in ranks]
    else:
        assert {r["hostname"] for r in ranks} == {socket.gethostname()}


def test_a_killed_mpiruns_stale_session_dir_does_not_fail_the_next_launch(openmpi5, tmp_path):
    """Open MPI 5: a SIGKILLed mpirun leaves $TMPDIR/ompi.<pid>; the next mpirun given that pid exits
    213 ("The PMIx server's listener thread failed to start"). mpilaunch starts mpirun behind a sweep
    of exactly that directory. Here the pid is made to collide: sh copies the stale directory to
    ompi.$$ and execs (same pid) the command mpilaunch would run."""
    from mpilaunch.core import mpi
    from mpilaunch.workloads.mpirun_command import without_stale_session

    info = mpi.detect(openmpi5.mpirun)
    env = {**mpilaunch_env(openmpi5), "TMPDIR": str(tmp_path)}
    # a real stale session: an mpirun SIGKILLed while its job runs
    victim = subprocess.Popen(
        [openmpi5.mpirun, "--allow-run-as-root", "-np", "1", "sleep", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    session = tmp_path / f"ompi.{victim.pid}"

    def job_runs() -> bool:  # its rank started: mpirun's start-up is over (a session file seen earlier
        # was sometimes gone after the kill: mpirun had not finished making its session directory)
        try:
            ranks = [c for c in psutil.Process(victim.pid).children(recursive=True) if c.name() == "sleep"]
        except psutil.NoSuchProcess:
            return False
        return bool(ranks) and bool(list(session.glob("pmix.*")))

    wait_for(job_runs, 30, "mpirun's rank to start")
    # mpirun and the rank it forked, in one signal to the process group of their own: killing the
    # rank first gave a loaded mpirun the moment to notice and sweep its session directory itself
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert list(session.glob("pmix.*")), "mpirun left no session directory to test with"
    session.rename(tmp_path / "stale")

    def launch(argv):
        collide = f'cp -a {tmp_path / "stale"} "$TMPDIR/ompi.$$" && exec "$@"'
        return subprocess.run(
            ["/bin/sh", "-c", collide, "sh", *argv], env=env, capture_output=True, text=True, timeout=120
        )

    plain = [openmpi5.mpirun, "--allow-run-as-root", "-np", "1", "true"]
    bare = launch(plain)
    assert bare.returncode == 213 and "listener thread failed to start" in bare.stdout + bare.stderr, bare
    swept = launch(without_stale_session(plain, info))
    assert swept.returncode == 0, swept.stdout + swept.stderr
