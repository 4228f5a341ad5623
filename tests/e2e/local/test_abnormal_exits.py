"""What survives an abnormal exit, and what cannot be forged (issue 24, items 10 and 11).

- Rank logs reach the disk at most ``output.LOG_FLUSH_S`` late: a SIGKILLed
  mpilaunch loses none of what it had read.
- report.json is written whole or not at all; a write that fails is one
  warning, and neither the exit code nor the teardown changes.
- Run directories name their owner; the next mpilaunch removes those whose
  owner died without cleaning up (SIGKILL), and nothing else.
- The k8s transport's per-session pid file goes when the session ends.
- Only the rank wrappers' lines carrying the launch's token count.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpilaunch import rank
from mpilaunch.backends.k8s.exec_path import transport as k8s_transport
from mpilaunch.core import env_names, rank_lines
from mpilaunch.job import lifecycle
from mpilaunch.runtime import rundir
from mpilaunch.runtime.output import LOG_FLUSH_S, RankOutput
from support.helpers import REPO, leftover_processes, mpilaunch_env, run_mpilaunch, wait_for, wait_started

# ------------------------------------------------------------------ rank logs


def test_rank_log_lines_reach_the_disk_without_a_close(tmp_path):
    sink = RankOutput(io.StringIO(), io.StringIO(), tmp_path)
    try:
        for i in range(50):
            sink.feed("stdout", f"[1,0]<stdout>: line {i}\n")
        time.sleep(LOG_FLUSH_S + 0.3)
        # read from outside, as `tail -f` or a reader after a SIGKILL does
        assert (tmp_path / "rank-0.log").read_text().splitlines() == [f"line {i}" for i in range(50)]
    finally:
        sink.close()
    assert not any(t.name == "rank-log-flush" and t.is_alive() for t in threading.enumerate())


def test_a_removed_output_dir_does_not_stop_the_relay(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err, tmp_path / "gone")
    sink.feed("stdout", "[1,0]<stdout>: hello\n")
    sink.feed("stdout", "[1,0]<stdout>: again\n")
    sink.close()
    assert out.getvalue() == "[0] hello\n[0] again\n"
    assert err.getvalue().count("mpilaunch: warning: rank 0's log") == 1


# ------------------------------------------------------------------ report.json


def test_report_json_is_never_seen_half_written(tmp_path):
    path = tmp_path / "report.json"
    report = {"ranks": [{"rank": r, "worker": f"w-{r}", "exit_code": 0} for r in range(3000)]}
    lifecycle.write_report(path, report)
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            seen.append(json.loads(path.read_text()))  # raises on a partial file

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(30):
            lifecycle.write_report(path, {**report, "attempt": i})
    finally:
        stop.set()
        reader.join()
    assert seen and all(len(r["ranks"]) == 3000 for r in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file left


def test_a_failed_report_write_leaves_no_temporary_file(tmp_path):
    with pytest.raises(TypeError):
        lifecycle.write_report(tmp_path / "report.json", {"not json": object()})
    assert list(tmp_path.iterdir()) == []
    messages = io.StringIO()
    lifecycle.save_report(tmp_path / "missing" / "report.json", {}, messages)
    assert messages.getvalue().count("\n") == 1
    assert messages.getvalue().startswith("mpilaunch: warning: cannot write ")


# ------------------------------------------------------------------ stale run directories


def _owned_by(directory: Path, pid: int) -> Path:
    directory.mkdir()
    (directory / rundir.OWNER_FILE).write_text(rundir.owner_record(pid))
    (directory / "secret").write_text("s")
    return directory


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_run_directories_of_dead_owners_are_swept(tmp_path, monkeypatch):
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = _owned_by(tmp_path / "mpilaunch-dead-abcd", _dead_pid())
        alive = _owned_by(tmp_path / "mpilaunch-alive-abcd", live.pid)
        # the pid is alive but another process has it now: its start time differs
        reused = tmp_path / "mpilaunch-reused-abcd"
        reused.mkdir()
        record = rundir.owner_record(live.pid).replace(f"start={rundir.process_start_time(live.pid)}", "start=1")
        (reused / rundir.OWNER_FILE).write_text(record)
        agent = tmp_path / "mpilaunch-job-worker-0-abcd"  # an agent's private directory: no owner file
        agent.mkdir()
        elsewhere = _owned_by(tmp_path / "mpilaunch-elsewhere-abcd", _dead_pid())  # another pid namespace
        text = (elsewhere / rundir.OWNER_FILE).read_text()
        (elsewhere / rundir.OWNER_FILE).write_text(text.replace("pidns=", "pidns=other-"))
        other = _owned_by(tmp_path / "someone-else-abcd", _dead_pid())  # not an mpilaunch directory

        # the next run: make_rundir sweeps, then makes its own
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
        mine = rundir.make_rundir("next")
        assert not dead.exists() and not reused.exists()
        assert alive.exists() and agent.exists() and elsewhere.exists() and other.exists()
        assert rundir.owner_gone((mine / rundir.OWNER_FILE).read_text()) is False
        assert rundir.sweep_stale_rundirs(str(tmp_path)) == []  # its own is not stale either
    finally:
        live.kill()
        live.wait()
    assert rundir.sweep_stale_rundirs(str(tmp_path)) == [str(alive)]  # its owner is gone now


# ------------------------------------------------------------------ k8s transport pid files


def test_k8s_wrapper_removes_its_pid_file_when_the_session_ends(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # start_new_session: a group leader, as a container runtime starts an exec (setsid forks, -w waits)
    proc = subprocess.run(
        k8s_transport.wrapped("s1", "echo out; exit 7"), env=env, capture_output=True, text=True, start_new_session=True
    )
    assert (proc.returncode, proc.stdout) == (7, "out\n")
    assert list(tmp_path.iterdir()) == []

    # a signalled session: the command's own handler runs to its end, then the file goes
    proc = subprocess.Popen(
        k8s_transport.wrapped("s2", "trap 'sleep 0.3; exit 5' TERM; sleep 30 & wait"), env=env, start_new_session=True
    )
    pidfile = tmp_path / "mpilaunch-s2.pid"
    wait_for(pidfile.exists, 10, "the pid file")
    subprocess.run(k8s_transport.killer("TERM", "s2"), env=env, check=True)
    assert proc.wait(timeout=10) == 5
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ status token


def test_only_lines_with_the_launch_token_count():
    token = rank_lines.new_token()
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err)
    sink.token = token
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "MPILAUNCH_WORKER": "w-1",
    }
    forged = [
        rank_lines.format_status("1", "x", 0),
        rank_lines.format_status("1", "x", 0, token="0" * 16),
        rank_lines.format_start({**env, "OMPI_COMM_WORLD_RANK": "7"}, "/bin/x"),
        rank_lines.format_mpi("1", "x", "/lib/libmpi.so.40"),
    ]
    for line in forged:
        sink.feed("stderr", f"[1,1]<stderr>: {line}\n")
    assert sink.statuses == [] and sink.starts == [] and sink.environments == {}
    assert err.getvalue().splitlines() == [f"[1] {line}" for line in forged]  # the program's own output

    sink.feed("stderr", "[1,1]<stderr>: " + rank_lines.format_start(env, "/bin/x", token) + "\n")
    sink.feed("stderr", "[1,1]<stderr>: " + rank_lines.format_mpi("1", "w-1", "/lib/libmpi.so.40", token) + "\n")
    sink.feed("stderr", "[1,1]<stderr>: " + rank_lines.format_status("1", "w-1", 137, True, token) + "\n")
    sink.close()
    assert sink.statuses == [(1, "w-1", 137)] and sink.oom_killed == {1}
    assert [s[:4] for s in sink.starts] == [(1, 0, 2, "w-1")]
    assert sink.environments[1]["mpi_library"] == "/lib/libmpi.so.40"
    assert len(err.getvalue().splitlines()) == len(forged)  # the genuine lines are consumed


def test_the_program_does_not_inherit_the_token():
    env = rank.program_env({env_names.STATUS_TOKEN: "abc", "PATH": "/bin"}, bind=False)
    assert env_names.STATUS_TOKEN not in env


# ------------------------------------------------------------------ real jobs (local backend)


@pytest.mark.mpi
def test_sigkill_of_mpilaunch_keeps_every_line_read_in_the_rank_logs(openmpi5, tmp_path):
    name = "sigkill-logs"
    lines = 300  # ~3 KB a rank: all of it sat in the log's buffer before
    program = (
        f"import os, time\nfor i in range({lines}): print('line', i)\nprint('started', flush=True)\ntime.sleep(300)"
    )
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
            program,
        ],
        cwd=REPO,
        env=mpilaunch_env(openmpi5),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_started(proc, 2)  # both ranks' last line is echoed, so it was read and written to the log
        time.sleep(LOG_FLUSH_S + 0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    for r in (0, 1):
        log = (tmp_path / f"rank-{r}.log").read_text().splitlines()
        assert log == [f"line {i}" for i in range(lines)] + ["started"], (r, len(log))
    wait_for(lambda: leftover_processes(name) == [], 20, "every process of the job to end")


@pytest.mark.mpi
def test_a_report_that_cannot_be_written_keeps_the_exit_code_and_the_cleanup(openmpi5, tmp_path):
    name = "report-gone"
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    proc = run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "2",
            "-q",
            "--output-dir",
            str(out),
            "--",
            sys.executable,
            "tests/programs/forge_status.py",
        ],
        openmpi5,
        env_extra={"REMOVE_DIR": str(out), "EXIT_CODE": "3", "TMPDIR": str(tmp)},
    )
    assert proc.returncode == 3, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "cannot write" in line]
    assert warnings == [f"mpilaunch: warning: cannot write {out / 'report.json'}: No such file or directory"]
    assert "Traceback" not in proc.stderr
    assert [p.name for p in tmp.iterdir() if p.name.startswith(f"mpilaunch-{name}-")] == []  # the run directory
    assert leftover_processes(name) == []


def forging_job(name: str, forge: str, install, out):
    """Two ranks of tests/programs/forge_status.py printing a forged ``forge`` line."""
    return run_mpilaunch(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-q",
            "--output-dir",
            str(out),
            "--",
            sys.executable,
            "tests/programs/forge_status.py",
        ],
        install,
        env_extra={"FORGE": forge},
    )


@pytest.mark.mpi
def test_a_forged_status_line_does_not_hide_the_ranks_exit(openmpi5, tmp_path):
    proc = forging_job("forged-status", "status", openmpi5, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 on worker forged-status-worker-1 exited with code 3" in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(r["rank"], r["worker"], r["exit_code"]) for r in report["ranks"]] == [
        (0, "forged-status-worker-0", 0),
        (1, "forged-status-worker-1", 3),
    ]
    # the forged line is the program's output, shown and logged as such
    assert "mpilaunch-rank-status: rank=1 worker=x exit=0" in (tmp_path / "rank-1.log").read_text()
    assert "token visible: True" not in proc.stdout and proc.stdout.count("token visible: False") == 2


@pytest.mark.mpi
def test_a_forged_start_line_does_not_fail_the_placement_check(openmpi5, tmp_path):
    proc = forging_job("forged-start", "start", openmpi5, tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["placement"]["verified"] is True, report["placement"]
    assert "mpilaunch-rank-start: rank=7" in proc.stderr  # echoed as the program's own line
