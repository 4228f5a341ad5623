"""--collect and --timeline on the local backend: real Open MPI jobs whose ranks write files
(tests/programs/write_files.py), brought back after a success, a failed rank, --timeout and
--stall-timeout, with the caps' one line per skipped file. Each job runs in a directory of its
own (the ranks' working directory: relative globs start there) with a state directory of its own.

The local backend's workers share this machine's directory: their files come once, under the
first worker's name (runtime/artifacts.py).
"""

import json
import os
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_HUNG, EXIT_TIMEOUT
from support.helpers import PROGRAMS, REPO, leftover_processes, mpilaunch_env

pytestmark = pytest.mark.mpi

PROGRAM = str(PROGRAMS / "write_files.py")


def run_job(install, name, where, *args, mode="ok", env=None, timeout=240):
    """``mpilaunch --name NAME ARGS -- python write_files.py MODE`` run in ``where``/job."""
    cwd = where / "job"
    cwd.mkdir(exist_ok=True)
    env = mpilaunch_env(install, MPILAUNCH_STATE_DIR=str(where / "state"), **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)  # this checkout's
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--mpirun", install.mpirun, "--name", name, *args]
        + ["--", sys.executable, PROGRAM, mode],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def collect_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: collect:")]


def tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_collect_files_after_a_successful_job_into_the_record(openmpi5, tmp_path):
    """No --output-dir: the files go into the job's record, next to its report.json, and the
    closing summary names them; a relative glob, a directory and an absolute glob."""
    name = "collect-ok"
    absolute = tmp_path / "abs"
    absolute.mkdir()
    proc = run_job(
        openmpi5,
        name,
        tmp_path,
        "--np",
        "4",
        "--slots-per-worker",
        "2",
        "--collect",
        "results/*.json",
        "--collect",
        "results",  # a directory: the same files, taken once
        "--collect",
        f"{absolute}/abs-*.txt",
        env={"WRITE_DIR": str(absolute)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert collect_lines(proc.stderr) == [], proc.stderr
    [run_dir] = os.listdir(tmp_path / "state" / "runs")
    record = tmp_path / "state" / "runs" / run_dir
    files = record / "files"
    worker = f"{name}-worker-0"
    abs_names = [f"{worker}/{absolute.relative_to('/')}/abs-{r}.txt" for r in range(4)]
    assert tree(files) == sorted([f"{worker}/results/rank-{r}.json" for r in range(4)] + abs_names), tree(files)
    ranks = [json.loads((files / worker / "results" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["worker"] for r in ranks} == {f"{name}-worker-0", f"{name}-worker-1"}
    assert (files / abs_names[2]).read_text() == f"rank 2 on {name}-worker-1\n"
    report = json.loads((record / "report.json").read_text())
    collected = report["collected"]
    assert (collected["files"], collected["dir"], collected["skipped"]) == (8, str(files), 0), collected
    assert collected["bytes"] == sum((files / n).stat().st_size for n in tree(files))
    assert f"  collected: 8 files, {collected['bytes']} B in {files}" in proc.stderr.splitlines(), proc.stderr
    assert leftover_processes(name) == []


def test_collect_files_after_a_failed_rank(openmpi5, tmp_path):
    """Rank 1 exits 7: the job fails with its code, and its files still come back (--output-dir)."""
    name = "collect-fail"
    out = tmp_path / "out"
    proc = run_job(
        openmpi5, name, tmp_path, "--np", "2", "--output-dir", str(out), "--collect", "results/*", "-q", mode="fail"
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    rank1 = out / "files" / f"{name}-worker-0" / "results" / "rank-1.json"
    assert json.loads(rank1.read_text())["rank"] == 1, tree(out)
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 7 and report["collected"]["dir"] == str(out / "files"), report.get("collected")
    n = report["collected"]["files"]
    assert f"; collected: {n} file{'s' if n > 1 else ''}, " in proc.stderr, proc.stderr
    assert leftover_processes(name) == []


def test_collect_files_after_a_timeout(openmpi5, tmp_path):
    """--timeout 6: the ranks are stopped, the workers still held, and then the files come back."""
    name = "collect-timeout"
    out = tmp_path / "out"
    proc = run_job(
        openmpi5,
        name,
        tmp_path,
        "--np",
        "2",
        "--timeout",
        "6",
        "--output-dir",
        str(out),
        "--collect",
        "results/*.json",
        mode="sleep",
    )
    assert proc.returncode == EXIT_TIMEOUT, proc.stdout + proc.stderr
    assert tree(out / "files") == [f"{name}-worker-0/results/rank-{r}.json" for r in range(2)], proc.stderr
    assert json.loads((out / "report.json").read_text())["collected"]["files"] == 2
    assert leftover_processes(name) == []


def test_collect_files_after_a_hung_job(openmpi5, tmp_path):
    """--stall-timeout: the job found hung (silent, stacks unchanged) is stopped, then collected."""
    name = "collect-hung"
    out = tmp_path / "out"
    proc = run_job(
        openmpi5,
        name,
        tmp_path,
        "--np",
        "2",
        "--stall-timeout",
        "6",
        "--timeout",
        "120",
        "--output-dir",
        str(out),
        "--collect",
        "results/*.json",
        mode="sleep",
    )
    assert proc.returncode == EXIT_HUNG, proc.stdout + proc.stderr
    assert tree(out / "files") == [f"{name}-worker-0/results/rank-{r}.json" for r in range(2)], proc.stderr
    assert leftover_processes(name) == []


def test_collect_files_caps_and_links_one_line_per_skipped_file(openmpi5, tmp_path):
    """A file over the per-file cap, one that no longer fits the job's cap, a link out of the
    working directory: one line each; the rest comes back."""
    name = "collect-caps"
    job = tmp_path / "job"
    (job / "big").mkdir(parents=True)
    (job / "big" / "a.bin").write_bytes(b"a" * 3000)
    (job / "big" / "b.bin").write_bytes(b"b" * 3000)  # a.bin and b.bin: 6000 B, over the 5000 B cap
    (job / "big" / "c.bin").write_bytes(b"c" * 1000)  # fits after b.bin was skipped
    (job / "big" / "huge.bin").write_bytes(b"h" * 4500)  # over the 4000 B per-file cap
    (job / "big" / "secret.bin").symlink_to("/etc/hostname")
    out = tmp_path / "out"
    proc = run_job(
        openmpi5,
        name,
        tmp_path,
        "--np",
        "1",
        "--output-dir",
        str(out),
        "--collect",
        "big/*.bin",
        "--collect",
        "missing-*.log",
        "--collect-max",
        "5000",
        "--collect-max-file",
        "4000",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker = f"{name}-worker-0"
    assert collect_lines(proc.stderr) == [
        f"mpilaunch: collect: skipped {worker}:{job}/big/secret.bin (a symbolic link out of {job})",
        f"mpilaunch: collect: skipped {worker}:{job}/big/b.bin (2.9 KiB over the 4.9 KiB cap, 2.9 KiB collected "
        "before it)",
        f"mpilaunch: collect: skipped {worker}:{job}/big/huge.bin (4.4 KiB over the 3.9 KiB per-file cap)",
        "mpilaunch: collect: nothing matched 'missing-*.log' on any worker",
    ], proc.stderr
    assert tree(out / "files") == [f"{worker}/big/a.bin", f"{worker}/big/c.bin"]
    assert (out / "files" / worker / "big" / "c.bin").read_bytes() == b"c" * 1000
    collected = json.loads((out / "report.json").read_text())["collected"]
    assert (collected["files"], collected["bytes"], collected["skipped"]) == (2, 4000, 3), collected


def test_collect_files_timeline_sets_horovod_timeline_and_brings_it_back(openmpi5, tmp_path):
    """--timeline FILE: the ranks get HOROVOD_TIMELINE=FILE (rank 0 writes it, as Horovod's does)
    and the file comes back, as horovodrun --timeline-filename's would stay on the host."""
    name = "collect-timeline"
    out = tmp_path / "out"
    proc = run_job(openmpi5, name, tmp_path, "--np", "2", "--output-dir", str(out), "--timeline", "tl.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads((out / "files" / f"{name}-worker-0" / "tl.json").read_text())
    assert events[0]["name"] == "write_files"
    assert json.loads((out / "report.json").read_text())["collected"]["globs"] == ["tl.json"]


@pytest.mark.parametrize(
    "args,first",
    [
        (
            ["--backend", "k8s", "--detach", "--collect", "*.json"],
            "mpilaunch: error: --collect needs this mpilaunch to stay until the job ends; --detach leaves at once",
        ),
        (
            ["--backend", "k8s", "--detach", "--timeline", "tl.json"],
            "mpilaunch: error: --timeline needs this mpilaunch to stay until the job ends; --detach leaves at once",
        ),
        (
            ["--collect", "*.json", "--collect-max", "lots"],
            "mpilaunch: error: --collect-max takes a size such as 1G, 512M or 4096 (bytes); got 'lots'",
        ),
        (
            ["--timeline", "a.json", "-x", "HOROVOD_TIMELINE=b.json"],
            "mpilaunch: error: --timeline a.json and -x HOROVOD_TIMELINE=b.json both set HOROVOD_TIMELINE",
        ),
    ],
)
def test_collect_files_bad_input_one_line_exit_2(args, first, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args, "--np", "2", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=mpilaunch_env(MPILAUNCH_STATE_DIR=str(tmp_path)),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0] == first, proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_collect_files_without_a_place_to_keep_them_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--collect", "*.json", "--np", "1", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=mpilaunch_env(MPILAUNCH_KEEP_RECORDS="0"),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("mpilaunch: error: --collect and --timeline bring files into")
    assert proc.stderr.splitlines()[1] == "  hint: add --output-dir DIR", proc.stderr
