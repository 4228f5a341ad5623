"""--detach on the real YARN testbed: submit, exit 0, and come back with wait / status / logs.

The cluster launcher (yarn's default) runs the job in its own container; a
detached job's launcher ends the application itself, so after it the
ResourceManager holds the outcome and no container or process stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from support.helpers import REPO, wait_for
from support.yarn import app_by_name, assert_released

pytestmark = pytest.mark.yarn

TICKS = r"""
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for i in range(int(os.environ.get("TICKS", "3"))):
    print(f"rank {rank} tick {i}", flush=True)
    time.sleep(1)
release = os.environ.get("RELEASE_FILE")
deadline = time.time() + 300
while release and not os.path.exists(release) and time.time() < deadline:
    time.sleep(0.2)
print(f"rank {rank} done", flush=True)
"""


def submit(name, args, ctx):
    """mpilaunch --detach, leading its own session: (result, seconds it took, processes it left behind)."""
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "yarn",
        "--mpirun",
        ctx["mpirun"],
        "--name",
        name,
        "--detach",
        "--memory",
        "256 MiB",
        "-q",
        *args,
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=ctx["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out, err = proc.communicate(timeout=240)
    took = time.monotonic() - t0
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), took, session_members(proc.pid)


def session_members(sid: int) -> list[str]:
    """Processes still in a session (mpilaunch's skein driver would be one)."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(p.info["pid"]) == sid:
                left.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'] or [])[:120]}")
        except OSError:
            pass
    return left


def manage(ctx, *args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args, "--backend", "yarn"],
        cwd=REPO,
        env=ctx["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_detach_succeeds_exits_0_then_wait_logs_and_nothing_stays(yarn, openmpi_env, tmp_path):
    name = "yarn-detach-ok"
    (tmp_path / "ticks.py").write_text(TICKS)
    release = tmp_path / "release"
    proc, took, left = submit(
        name,
        [
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-x",
            f"RELEASE_FILE={release}",
            "--",
            sys.executable,
            str(tmp_path / "ticks.py"),
        ],
        openmpi_env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 120, took  # it waited for the containers, not for the job (which holds until released)
    assert f"mpilaunch: submitted job {name} (2 workers, 2 ranks)" in proc.stdout, proc.stdout
    for command in (f"logs -f {name}", f"status {name}", f"wait {name}", f"delete {name}"):
        assert f"mpilaunch {command} --backend yarn" in proc.stdout, proc.stdout
    # the job runs on without mpilaunch: its application, and nothing of mpilaunch on this machine
    app = app_by_name(yarn, name)
    assert app["state"] == "RUNNING", app
    assert left == []
    status = manage(openmpi_env, "status", name)
    assert status.returncode == 0, status.stderr
    assert f"{app['id']}  {name}  Running  elapsed " in status.stdout, status.stdout
    assert "launcher " in status.stdout and status.stdout.count(" worker ") == 2, status.stdout
    timed_out = manage(openmpi_env, "wait", name, "--timeout", "2")
    assert timed_out.returncode == 124, timed_out.stdout + timed_out.stderr
    assert f"mpilaunch: error: job {name} ({app['id']}) still Running after --timeout 2s" in timed_out.stderr
    release.touch()
    waited = manage(openmpi_env, "wait", name)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert f"job {name} ({app['id']}) succeeded (exit 0)" in waited.stdout, waited.stdout
    assert waited.stderr.startswith(f"mpilaunch: job {name} succeeded in "), waited.stderr  # the closing summary
    assert_released(yarn, name, "SUCCEEDED")  # no container, no process of the job
    logs = manage(openmpi_env, "logs", name)
    assert logs.returncode == 0, logs.stderr
    for rank in (0, 1):
        assert f"rank {rank} tick 2" in logs.stdout and f"rank {rank} done" in logs.stdout, logs.stdout
    status = manage(openmpi_env, "status", name)
    assert f"{app['id']}  {name}  Succeeded (exit 0)" in status.stdout, status.stdout
    assert "no containers left: all released" in status.stdout, status.stdout


def test_detach_rank_failure_wait_exits_with_its_code_naming_rank_and_worker(yarn, openmpi_env):
    name = "yarn-detach-fail"
    proc, _, _ = submit(
        name,
        [
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-x",
            "FAIL_RANK=2",
            "-x",
            "FAIL_CODE=7",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    waited = manage(openmpi_env, "wait", name)
    assert waited.returncode == 7, waited.stdout + waited.stderr
    first = waited.stderr.splitlines()[0]
    assert first == f"mpilaunch: error: rank 2 on worker {name}-worker-1 exited with code 7", waited.stderr
    app = assert_released(yarn, name, "FAILED")
    assert app["diagnostics"].startswith(f"mpilaunch: exit 7: rank 2 on worker {name}-worker-1"), app
    logs = manage(openmpi_env, "logs", name)
    assert "rank 2 about to fail" in logs.stdout, logs.stdout


def test_run_summary_detached_yarn_wait_and_logs_end_with_it(yarn, openmpi_env):
    """The launcher container leaves the closing summary's facts in the application's final diagnostics
    (``yarn/outcome.py``), which `wait` prints as the summary, and ends its log with the summary."""
    name = "yarn-detach-summary"
    program = [sys.executable, str(REPO / "tests/programs/fail_rank.py")]
    env = ["-x", "FAIL_RANK=1", "-x", "FAIL_CODE=7", "-x", "SLEEP=0"]
    proc, _, _ = submit(name, ["--np", "2", "--slots-per-worker", "1", *env, "--", *program], openmpi_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    waited = manage(openmpi_env, "wait", name)
    assert waited.returncode == 7, waited.stdout + waited.stderr
    lines = waited.stderr.splitlines()
    failure = f"rank 1 on worker {name}-worker-1 exited with code 7"
    assert lines[0] == f"mpilaunch: error: {failure}", lines
    assert lines[1].startswith(f"mpilaunch: job {name} failed (exit 7) in ") and lines[1].endswith(failure), lines
    assert lines[2].startswith("  2 ranks on 2 workers;") and lines[2].endswith("; backend yarn"), lines
    assert lines[3].startswith("  time: ") and lines[4].startswith("  ledger: "), lines
    app = assert_released(yarn, name, "FAILED")
    assert "\nmpilaunch summary: {" in app["diagnostics"], app["diagnostics"]
    logs = manage(openmpi_env, "logs", name)
    assert logs.returncode == 0, logs.stderr
    tail = [line for line in logs.stdout.splitlines() if line.strip()][-4:]
    assert tail[0] == lines[1] and tail[1] == lines[2] and tail[3].startswith("  ledger: "), logs.stdout[-2000:]


def test_detach_logs_follow_prints_while_ranks_print(yarn, openmpi_env, tmp_path):
    name = "yarn-detach-follow"
    (tmp_path / "ticks.py").write_text(TICKS)
    release = tmp_path / "release"
    proc, _, _ = submit(
        name,
        [
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-x",
            f"RELEASE_FILE={release}",
            "-x",
            "TICKS=2",
            "--",
            sys.executable,
            str(tmp_path / "ticks.py"),
        ],
        openmpi_env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    follow = subprocess.Popen(
        [sys.executable, "-m", "mpilaunch", "logs", "-f", name, "--backend", "yarn"],
        cwd=REPO,
        env=openmpi_env["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        deadline = time.monotonic() + 120
        # the ranks hold until the release file exists: these lines can only come while they run
        while not all(f"rank {r} tick 1" in "".join(seen) for r in (0, 1)) and time.monotonic() < deadline:
            line = follow.stdout.readline()
            if not line:
                break
            seen.append(line)
        assert all(f"rank {r} tick 1" in "".join(seen) for r in (0, 1)), "".join(seen)
        assert app_by_name(yarn, name)["state"] == "RUNNING"
        release.touch()
        rest, err = follow.communicate(timeout=120)  # ends by itself once the application ended
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert "rank 0 done" in rest and "rank 1 done" in rest, rest
    assert_released(yarn, name, "SUCCEEDED")


def test_detach_lost_worker_killed_agent_is_named_by_wait(yarn, openmpi_env):
    """Nobody on the submitting side watches a detached job's containers: the launcher does, and says which was lost."""
    name = "yarn-detach-lost"
    proc, _, _ = submit(
        name,
        [
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    victim = wait_for(
        lambda: [
            p
            for p in psutil.process_iter(["pid", "cmdline"])
            if f"{name}-worker-1" in (p.info["cmdline"] or [])
            and "mpilaunch.agent" in " ".join(p.info["cmdline"] or [])
        ],
        60,
        "worker-1's agent",
    )
    assert len(victim) == 1
    container = victim[0].environ().get("CONTAINER_ID")
    wait_for(lambda: "rank 3 started" in manage(openmpi_env, "logs", name).stdout, 120, "rank 3 to start")
    victim[0].kill()
    waited = manage(openmpi_env, "wait", name)
    assert waited.returncode == EXIT_WORKER_LOST == 5, waited.stdout + waited.stderr
    first = waited.stderr.splitlines()[0]
    assert first.startswith(f"mpilaunch: error: worker {name}-worker-1 (container {container} on "), first
    assert " was lost: " in first and first.endswith("; ranks 2-3 ran there"), first
    assert_released(yarn, name, "FAILED")
