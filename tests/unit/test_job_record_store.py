"""Where records are kept and how many (mpilaunch/runtime/record.py), and `mpilaunch report` on bad input.

The jobs that write them for real are tests/e2e/local/test_job_record.py.
"""

import json
import os
import stat
import subprocess
import sys

import pytest

from mpilaunch.core.errors import UsageError
from mpilaunch.runtime import record


def test_job_record_state_dir_follows_xdg_and_the_override():
    assert record.state_dir({"HOME": "/home/u"}) == record.Path("/home/u/.local/state/mpilaunch")
    assert record.state_dir({"HOME": "/home/u", "XDG_STATE_HOME": "/xdg"}) == record.Path("/xdg/mpilaunch")
    # the XDG spec: a relative XDG_STATE_HOME is invalid and ignored
    assert record.state_dir({"HOME": "/home/u", "XDG_STATE_HOME": "rel"}) == record.Path(
        "/home/u/.local/state/mpilaunch"
    )
    assert record.state_dir({"HOME": "/h", "XDG_STATE_HOME": "/x", "MPILAUNCH_STATE_DIR": "/own"}) == record.Path(
        "/own"
    )


def test_job_record_times_are_iso_8601_utc():
    assert record.iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert record.iso_utc(1796600100.9999) == "2026-12-06T23:35:00.999Z"  # floored, never a second ahead
    assert record.utc_stamp(1796600100.5) == "20261206T233500Z"


def test_job_record_directory_is_private_and_named_by_job_and_utc_start(tmp_path):
    env = {"MPILAUNCH_STATE_DIR": str(tmp_path / "state")}
    path = record.keep({"job": "my-job", "exit_code": 0}, env, 100, 1796600100.0)
    assert path == tmp_path / "state" / "runs" / "my-job-20261206T233500Z" / "report.json"
    assert json.loads(path.read_text()) == {"job": "my-job", "exit_code": 0}
    for d in (tmp_path / "state", path.parent.parent, path.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    # the same job started again within that second: a directory of its own
    again = record.keep({"job": "my-job", "exit_code": 1}, env, 100, 1796600100.4)
    assert again.parent.name == "my-job-20261206T233500Z-1"
    assert record.find("my-job", env)[1] == again
    assert record.find("my-job", env, back=1)[1] == path


def test_job_record_pruned_to_the_newest_n(tmp_path):
    env = {"MPILAUNCH_STATE_DIR": str(tmp_path)}
    runs = tmp_path / "runs"
    (runs / "not-a-record").mkdir(parents=True)  # only what record.py names is ever removed
    for i in range(5):
        record.keep({"job": f"j{i % 2}", "exit_code": 0}, env, 3, 1796600100.0 + 60 * i)
    assert sorted(os.listdir(runs)) == [
        "j0-20261206T233700Z",
        "j0-20261206T233900Z",
        "j1-20261206T233800Z",
        "not-a-record",
    ]
    assert record.newest(env)[0]["job"] == "j0"


@pytest.mark.parametrize("value", ["x", "-1", "1.5"])
def test_job_record_bad_keep_count_is_bad_input(value):
    with pytest.raises(UsageError, match="MPILAUNCH_KEEP_RECORDS must be a whole number"):
        record.keep_records({"MPILAUNCH_KEEP_RECORDS": value})
    assert record.keep_records({}) == 100 and record.keep_records({"MPILAUNCH_KEEP_RECORDS": "0"}) == 0


def test_job_record_nodes_and_image_digest_from_the_workers_facts():
    workers = {
        "w-0": {"pod": "w-0", "node": "n2", "image": "reg/img:1", "image_id": "reg/img@sha256:abc"},
        "w-1": {"pod": "w-1", "node": "n1", "image": "reg/img:1", "image_id": "sha256:abc"},
        "w-2": {"host": "localhost"},
        "w-3": {},
    }
    assert record.nodes_of(workers) == ["localhost", "n1", "n2"]
    assert record.images_of(workers) == ("reg/img:1", "sha256:abc")
    assert record.images_of({"w": {"host": "h"}}) == (None, None)


def run_report(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["nosuch"], "no record of a job named 'nosuch'"),
        ([], "no job records in"),
        (["a", "b", "c"], "at most two records, got 3"),
        (["/nonexistent/report.json"], "no report.json at /nonexistent/report.json"),
        (["{bad}/report.json"], "is not an mpilaunch report"),
        (["{bad}/garbage.json"], "cannot read"),
    ],
)
def test_job_record_report_bad_input_is_one_line_and_a_hint_exit_2(tmp_path, args, expected):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text('{"something": "else"}')
    (bad / "garbage.json").write_text("{not json")
    args = [a.replace("{bad}", str(bad)) for a in args]
    proc = run_report(*args, env={"MPILAUNCH_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("mpilaunch: error: ") and expected in lines[0], proc.stderr
    assert lines[1].startswith("  hint: "), proc.stderr
    assert proc.stdout == ""


def test_job_record_a_name_is_a_job_before_a_directory_of_that_name_here(tmp_path, monkeypatch):
    env = {"MPILAUNCH_STATE_DIR": str(tmp_path / "state")}
    kept = record.keep({"job": "docs", "exit_code": 0}, env, 100, 1796600100.0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()  # `mpilaunch report docs` in a checkout: the job, not the folder
    assert record.find("docs", env)[1] == kept
    assert record.find(str(kept.parent), env)[1] == kept  # a path is a path
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text('{"job": "x", "exit_code": 0}')
    assert record.find("run", env)[0]["job"] == "x"  # no job of that name: the directory here
