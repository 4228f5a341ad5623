"""Every job's closing summary, printed for real: Open MPI jobs and a PS job on the local backend.

The summary is the last thing on stderr (after the progress lines, which a terminal's
progress bar clears), names the record the job kept, and is one line with -q. Its text
as such is tests/unit/test_run_summary_format.py.
"""

import json
import sys
from pathlib import Path

import pytest

from support.helpers import leftover_processes, run_mpilaunch
from support.mpi_installs import checked, installs

pytestmark = pytest.mark.mpi

PS_TASK = (
    "import os, time\n"
    "if os.environ['DTF_TASK_JOB_NAME'] == 'ps':\n"
    "    time.sleep(600)\n"  # a ps serves until the job ends it
    "print(os.environ['DTF_TASK_JOB_NAME'], 'done', flush=True)\n"
)


@pytest.fixture(params=["openmpi5", "openmpi4"])
def open_mpi(request):
    return checked(installs()[request.param])


def summary_after(stderr: str, head: str) -> list[str]:
    """The summary's lines: from its head line to the end of stderr, or to the error that follows."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(head)]
    assert len(starts) == 1, stderr
    out = []
    for line in lines[starts[0] :]:
        if line.startswith("mpilaunch: error:"):
            break
        out.append(line)
    return out


def recorded(line: str) -> dict:
    assert line.startswith("  record: "), line
    path = Path(line[len("  record: ") :])
    assert path.name == "report.json" and path.is_file(), path
    return json.loads(path.read_text())


def test_run_summary_of_a_success_stays_on_screen(open_mpi, tmp_path):
    name = f"sum-ok-{open_mpi.id}"
    proc = run_mpilaunch(
        ["--name", name, "--np", "4", "--slots-per-worker", "2", "--", sys.executable, "tests/programs/placement.py"],
        open_mpi,
        env_extra={"MPILAUNCH_STATE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = summary_after(proc.stderr, f"mpilaunch: job {name} succeeded in ")
    assert lines == proc.stderr.splitlines()[-len(lines) :]  # the last thing the job printed
    assert len(lines) == 5, lines
    version = "5." if open_mpi.id == "openmpi5" else "4.1"
    assert lines[1].startswith(f"  4 ranks on 2 workers; 1 node: localhost; Open MPI {version}"), lines[1]
    assert lines[1].endswith("; backend local")
    spent = [part.split()[0] for part in lines[2].removeprefix("  time: ").split(", ")]
    assert spent == ["allocate", "ready", "mpirun", "wire-up", "run", "mpirun", "release"], lines[2]
    assert lines[3].startswith("  ledger: ") and " worker-s held: " in lines[3], lines[3]
    report = recorded(lines[4])
    assert report["job"] == name and report["exit_code"] == 0
    book = report["ledger"]  # where the allocation went adds up to what was held
    assert book["unit"] == "worker_seconds" and book["count"] == 2
    parts = ("queue", "start", "wire_up", "program", "hang", "failed_attempts", "release")
    assert abs(sum(book[k] for k in parts) - book["allocated"]) < 0.01, book
    assert book["program"] > 0 and book["wire_up"] > 0  # local agents are often ready at once: start may be 0
    assert report["mpi"]["flavour"] == "openmpi" and report["mpi"]["version"].startswith(version)
    assert leftover_processes(name) == []


def test_run_summary_of_a_failure_names_the_failing_rank(openmpi5, tmp_path):
    name = "sum-fail"
    proc = run_mpilaunch(
        ["--name", name, "--np", "4", "--slots-per-worker", "2", "--", sys.executable, "tests/programs/fail_rank.py"],
        openmpi5,
        env_extra={"FAIL_RANK": "3", "FAIL_CODE": "7", "MPILAUNCH_STATE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    lines = summary_after(proc.stderr, f"mpilaunch: job {name} failed (exit 7) in ")
    assert lines[0].endswith(f": rank 3 on worker {name}-worker-1 exited with code 7"), lines[0]
    assert lines[1].startswith("  4 ranks on 2 workers; 1 node: localhost; Open MPI 5.")
    report = recorded(lines[-1])
    assert report["exit_code"] == 7 and report["ranks"][3]["exit_code"] == 7
    # the error and the failing rank's last lines come after the summary, as before
    error = proc.stderr.splitlines().index(f"mpilaunch: error: rank 3 on worker {name}-worker-1 exited with code 7")
    assert error > proc.stderr.splitlines().index(lines[-1])
    assert leftover_processes(name) == []


def test_run_summary_quiet_is_one_line(openmpi5, tmp_path):
    name = "sum-quiet"
    proc = run_mpilaunch(
        ["--name", name, "--np", "2", "-q", "--", sys.executable, "tests/programs/placement.py"],
        openmpi5,
        env_extra={"MPILAUNCH_STATE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("mpilaunch")]
    assert len(ours) == 1, proc.stderr
    head, _, path = ours[0].partition("; record: ")
    assert head.startswith(f"mpilaunch: job {name} succeeded in ") and head.endswith(": 2 ranks on 1 worker"), head
    assert json.loads(Path(path).read_text())["exit_code"] == 0


def test_run_summary_of_a_ps_job_has_the_task_table_and_the_record(tmp_path):
    name = "sum-ps"
    task = tmp_path / "task.py"
    task.write_text(PS_TASK)
    proc = run_mpilaunch(
        ["--name", name, "-r", "ps:1,worker:2", "--", sys.executable, str(task)],
        env_extra={"MPILAUNCH_STATE_DIR": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = summary_after(proc.stderr, f"mpilaunch: PS job {name} succeeded in ")
    assert lines == proc.stderr.splitlines()[-len(lines) :]
    assert lines[1] == "  3 tasks on 3 workers; 1 node: localhost; backend local", lines
    tasks = {line.split()[0]: line.split()[2] for line in lines[2:5]}
    assert tasks == {"worker:0": "succeeded", "worker:1": "succeeded", "ps:0": "terminated"}, lines
    assert lines[5].startswith("  time: allocate ") and " run " in lines[5], lines[5]
    assert lines[6].startswith("  ledger: "), lines[6]
    report = recorded(lines[7])
    assert report["mode"] == "ps" and report["schema_version"] == 1 and report["nodes"] == ["localhost"]
    assert leftover_processes(name) == []
