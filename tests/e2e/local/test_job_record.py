"""Every job keeps a record without asking, and `mpilaunch report` reads it again: real Open MPI
jobs on the local backend, each with a state directory of its own (MPILAUNCH_STATE_DIR).

The record's directory and pruning as such are tests/unit/test_job_record_store.py.
"""

import json
import os
import stat
import subprocess
import sys
from datetime import datetime

import pytest

from support.helpers import REPO, agent_workers, leftover_processes, mpilaunch_env, run_mpilaunch

pytestmark = pytest.mark.mpi


def iso(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text[:-1] + "+00:00")


def run_job(install, name, state, *args, env=None, program="tests/programs/placement.py"):
    return run_mpilaunch(
        ["--name", name, *args, "--", sys.executable, program],
        install,
        env_extra={"MPILAUNCH_STATE_DIR": str(state), **(env or {})},
    )


def report_cmd(state, *args):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=mpilaunch_env(MPILAUNCH_STATE_DIR=str(state)),
    )


def records(state) -> list[str]:
    return sorted(os.listdir(state / "runs"))


def test_job_record_written_without_output_dir(openmpi5, tmp_path):
    name = "rec-plain"
    state = tmp_path / "state"
    proc = run_job(openmpi5, name, state, "--np", "4", "--slots-per-worker", "2", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = records(state)
    assert run_dir.startswith(f"{name}-") and run_dir.endswith("Z"), run_dir
    path = state / "runs" / run_dir / "report.json"
    assert proc.stderr.rstrip().endswith(f"; record: {path}"), proc.stderr
    for d in (state, state / "runs", path.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    report = json.loads(path.read_text())
    assert report["schema_version"] == 1
    from mpilaunch import __version__

    assert report["mpilaunch_version"] == __version__
    started, ended = iso(report["started_at"]), iso(report["ended_at"])
    assert started < ended
    assert run_dir == f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}"
    assert report["command"] == [sys.executable, "tests/programs/placement.py"]
    assert report["nodes"] == ["localhost"]
    assert report["mpi"]["flavour"] == "openmpi" and report["mpi"]["version"].startswith("5.")
    assert report["mpi"]["mpirun"] == openmpi5.mpirun
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    for rank in report["ranks"]:  # each rank's start and end, within the job's
        assert started <= iso(rank["started_at"]) <= iso(rank["ended_at"]) <= ended, rank
    assert "image" not in report  # no image on the local backend
    assert leftover_processes(name) == []


def test_job_record_with_output_dir_is_written_there_and_kept(openmpi5, tmp_path):
    name = "rec-outdir"
    state, out = tmp_path / "state", tmp_path / "out"
    proc = run_job(openmpi5, name, state, "--np", "2", "-q", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.rstrip().endswith(f"; record: {out / 'report.json'}"), proc.stderr
    [run_dir] = records(state)
    kept = json.loads((state / "runs" / run_dir / "report.json").read_text())
    assert kept == json.loads((out / "report.json").read_text())


def test_job_record_pruned_to_keep_records(openmpi5, tmp_path):
    state = tmp_path / "state"
    for i in range(3):
        proc = run_job(openmpi5, f"rec-keep-{i}", state, "--np", "1", "-q", env={"MPILAUNCH_KEEP_RECORDS": "2"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [d.rsplit("-", 1)[0] for d in records(state)] == ["rec-keep-1", "rec-keep-2"]
    proc = run_job(openmpi5, "rec-keep-none", state, "--np", "1", "-q", env={"MPILAUNCH_KEEP_RECORDS": "0"})
    assert proc.returncode == 0 and "record:" not in proc.stderr, proc.stderr
    assert len(records(state)) == 2


def test_job_record_report_name_prints_the_summary_again(openmpi5, tmp_path):
    name = "rec-again"
    state = tmp_path / "state"
    proc = run_job(openmpi5, name, state, "--np", "4", "--slots-per-worker", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(f"mpilaunch: job {name} succeeded"))
    again = report_cmd(state, name)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == lines[head:]  # the same summary, the same record named
    [run_dir] = records(state)
    by_dir = report_cmd(state, str(state / "runs" / run_dir))
    newest = report_cmd(state)
    assert by_dir.stdout == newest.stdout == again.stdout


def test_job_record_side_by_side(openmpi5, tmp_path):
    name = "rec-pair"
    state = tmp_path / "state"
    ok = run_job(openmpi5, name, state, "--np", "4", "--slots-per-worker", "2", "-q")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    failed = run_job(
        openmpi5,
        name,
        state,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "-q",
        env={"FAIL_RANK": "2", "FAIL_CODE": "9"},
        program="tests/programs/fail_rank.py",
    )
    assert failed.returncode == 9, failed.stdout + failed.stderr
    first, second = (state / "runs" / d / "report.json" for d in records(state))
    pair = report_cmd(state, name, name)  # a job's last two runs
    assert pair.returncode == 0, pair.stderr
    lines = pair.stdout.splitlines()
    assert lines[:2] == [f"A: {first}", f"B: {second}"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert rows["exit"] == ["0", "9"]
    assert rows["job"] == [name, name]
    assert rows["total"][2].startswith("(") and rows["total"][3].endswith("%)"), rows["total"]
    assert {"allocate", "ready", "wire-up", "run", "release"} <= set(rows), sorted(rows)
    by_path = report_cmd(state, str(first), str(second))
    assert by_path.stdout == pair.stdout


def test_job_record_bad_keep_records_is_refused_before_anything_starts(openmpi5, tmp_path):
    name = "rec-badkeep"
    proc = run_job(openmpi5, name, tmp_path, "--np", "2", env={"MPILAUNCH_KEEP_RECORDS": "many"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines == [
        "mpilaunch: error: MPILAUNCH_KEEP_RECORDS must be a whole number of records, 0 or more; got 'many'",
        "  hint: e.g. MPILAUNCH_KEEP_RECORDS=100 (the default), or 0 to keep no records",
    ]
    assert not (tmp_path / "runs").exists()
    assert [w for w in agent_workers().values() if w.startswith(name + "-")] == []


def test_job_record_unwritable_state_dir_is_one_warning_and_the_job_stands(openmpi5, tmp_path):
    state = tmp_path / "file"
    state.write_text("not a directory")
    proc = run_job(openmpi5, "rec-unwritable", state, "--np", "1", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: warning:")]
    assert len(warnings) == 1 and "record was not kept" in warnings[0], proc.stderr
    assert "record:" not in proc.stderr
