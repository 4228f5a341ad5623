"""Hung jobs on YARN: the verdict names the rank injected to hold the job up (issue 42).

tests/programs/hang.py makes one chosen rank sleep before the allreduce (or
wait in MPI_Recv) while the others wait in MPI; 4 ranks on 2 worker
containers. With ``--launcher local`` mpirun runs here; with the cluster
launcher it runs in the launcher container. Either way the submitting
mpilaunch reaches the workers' agents (their addresses and the job's secret
are its own), so the --timeout diagnosis is taken from here, before the stop,
and ``mpilaunch stacks NAME --backend yarn`` works through that mpilaunch's
run directory. A detached job has no such mpilaunch: ``stacks`` asks its
launcher container through the application's key-value store. Open MPI 5
(the YARN fixtures' MPI).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from mpilaunch.core.exit_codes import EXIT_HUNG, EXIT_TIMEOUT
from support.helpers import PROGRAMS, REPO, finish, mpilaunch_env, wait_for, wait_started
from support.yarn import app_by_name, assert_released, describe_app, start

pytestmark = pytest.mark.yarn

HANG = PROGRAMS / "hang.py"
STUCK = {m[1]: i for i, line in enumerate(HANG.read_text().splitlines(), 1) if (m := re.search(r"STUCK: (\S+)", line))}
NP, SLOTS = 4, 2


def job_args(name, launcher, mode, odd, out, *extra):
    return [
        "--name",
        name,
        "--launcher",
        launcher,
        "--np",
        str(NP),
        "--slots-per-worker",
        str(SLOTS),
        "--memory",
        "512 MiB",
        "--output-dir",
        str(out),
        *extra,
        "--",
        sys.executable,
        str(HANG),
        mode,
        str(odd),
    ]


def cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``mpilaunch ARGS`` (a manage command) with ``env``, as the user types it."""
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )


def verdict_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: hang:")]


@pytest.mark.parametrize(
    "launcher,mode,odd,py_spy",
    [("local", "sleep", 2, "py-spy"), ("cluster", "sleep", 1, "py-spy"), ("cluster", "recv", 3, "none")],
)
def test_yarn_hang_at_timeout_the_verdict_names_the_injected_rank(
    yarn, openmpi_env, tmp_path, launcher, mode, odd, py_spy
):
    name = f"yarn-hang-{launcher}-{mode}"
    extra_env = {"MPILAUNCH_PY_SPY": "none"} if py_spy == "none" else {}
    # 30 s: time for every rank to reach its stuck spot first. At 15 s, in a run from nothing (load
    # 20+), the cluster launcher's ranks had not started at the deadline: "every rank (0-3) is not
    # found on its worker", a true verdict about a job that had not begun (2026-11-28)
    proc = start(job_args(name, launcher, mode, odd, tmp_path, "--timeout", "30"), openmpi_env, extra_env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_TIMEOUT, out + err + describe_app(yarn, name)
    worker = f"{name}-worker-{odd // SLOTS}"
    if py_spy == "none":  # the faulthandler the ranks' sitecustomize armed: Python frames only
        mine, others = f"in comm.Recv at hang.py:{STUCK['recv']}", f"in comm.Barrier at hang.py:{STUCK['others-recv']}"
    else:
        mine = f"in time.sleep at hang.py:{STUCK['sleep']}"
        others = f"in MPI_Allreduce at hang.py:{STUCK['others']}"
    # on the submitting user's stderr, once
    assert verdict_lines(err) == [
        f"mpilaunch: hang: rank {odd} ({worker}) is {mine}; the 3 other ranks are {others}"
    ], err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == EXIT_TIMEOUT
    assert report["hang"]["odd_ranks"] == [odd] and report["hang"]["collection_s"] < 15
    assert [s["rank"] for s in report["stacks"]] == list(range(NP))
    tools = {s["tool"].split()[0] for s in report["stacks"]}  # "py-spy --native": py-spy
    assert tools == ({"faulthandler"} if py_spy == "none" else {"py-spy"}), report["stacks"]
    assert_released(yarn, name, "FAILED")


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_yarn_hang_stacks_command_on_a_running_job(yarn, openmpi_env, tmp_path, launcher):
    name = f"yarn-hang-stacks-{launcher}"
    proc = start(job_args(name, launcher, "sleep", 3, tmp_path, "--timeout", "120"), openmpi_env)
    try:
        wait_started(proc, NP, text="ready", timeout=180, context=lambda: describe_app(yarn, name))
        shown = cli(openmpi_env["env"], "stacks", name, "--backend", "yarn", timeout=60)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"ranks 0-2: MPI_Allreduce <- <module> (hang.py:{STUCK['others']})", shown.stdout
        assert lines[1] == f"rank 3: time.sleep <- <module> (hang.py:{STUCK['sleep']})", shown.stdout
        assert lines[2].startswith(f"mpilaunch: hang: rank 3 ({name}-worker-1) is in time.sleep"), shown.stdout
        assert proc.poll() is None  # the job runs on
        # the same job by another backend's name: not found
        wrong = cli(mpilaunch_env(), "stacks", name, "--backend", "local", timeout=60)
        assert wrong.returncode == 2
        assert wrong.stderr.startswith(f"mpilaunch: error: no running local job named {name!r}"), wrong.stderr
    finally:
        proc.terminate()
        finish(proc, 90)
    assert_released(yarn, name, "KILLED")


def stacks_command(name, ctx, tmp_path, *extra):
    """``mpilaunch stacks NAME --backend yarn`` as from another machine: its own TMPDIR, so the run
    directory of the launcher container (on this one-machine testbed, in this machine's /tmp) is not
    found and the launcher is asked through the key-value store. (stdout, stderr, rc, seconds)"""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    t0 = time.monotonic()
    shown = cli({**ctx["env"], "TMPDIR": str(elsewhere)}, "stacks", name, "--backend", "yarn", *extra)
    return shown, time.monotonic() - t0


def stacks_keys_left(app_id, ctx) -> list[str]:
    """The stacks requests and replies in the application's key-value store, read as its owner."""
    code = (
        "import sys\n"
        "from mpilaunch.backends.yarn import client\n"
        "c = client.skein_client()\n"
        "app = c.connect(sys.argv[1], wait=False, security=client.application_security(sys.argv[1]))\n"
        "print('\\n'.join(app.kv.list_keys(prefix='mpilaunch/launcher/stacks/')))\n"
        "app.close(); c.close()\n"
    )
    left = subprocess.run(
        [sys.executable, "-c", code, app_id], capture_output=True, text=True, cwd=REPO, env=ctx["env"], timeout=120
    )
    assert left.returncode == 0, left.stderr
    return left.stdout.split()


def test_yarn_hang_stacks_command_on_a_detached_job_asks_its_launcher(yarn, openmpi_env, tmp_path):
    """No mpilaunch runs the job anywhere: its launcher container takes the stacks (it alone holds
    the job's secret) and hands them over through the application's key-value store."""
    name, odd = "yarn-hang-detached", 1
    args = ["--name", name, "--np", str(NP), "--slots-per-worker", str(SLOTS), "--memory", "512 MiB"]
    proc = start(
        [*args, "--detach", "--timeout", "600", "--", sys.executable, str(HANG), "sleep", str(odd)], openmpi_env
    )
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err + describe_app(yarn, name)
    app_id = app_by_name(yarn, name)["id"]
    try:

        def all_ready():
            text = cli(openmpi_env["env"], "logs", name, "--backend", "yarn").stdout
            return all(f"rank {r} ready" in text for r in range(NP))

        wait_for(all_ready, 180, "every rank to be ready")
        shown, took = stacks_command(name, openmpi_env, tmp_path)
        print(f"mpilaunch stacks on the detached job took {took:.1f} s")
        assert shown.returncode == 0, shown.stderr + describe_app(yarn, name)
        lines = shown.stdout.splitlines()
        assert lines[0] == f"ranks 0,2-3: MPI_Allreduce <- <module> (hang.py:{STUCK['others']})", shown.stdout
        assert lines[1] == f"rank {odd}: time.sleep <- <module> (hang.py:{STUCK['sleep']})", shown.stdout
        assert lines[2] == (
            f"mpilaunch: hang: rank {odd} ({name}-worker-0) is in time.sleep at hang.py:{STUCK['sleep']}; "
            f"the 3 other ranks are in MPI_Allreduce at hang.py:{STUCK['others']}"
        ), shown.stdout
        assert took < 15 + 10 + 30, took  # the deadline, the reply's margin, and the credentials (two JVMs)
        shown, took = stacks_command(name, openmpi_env, tmp_path, "--json", "--deadline", "10")
        print(f"mpilaunch stacks --json on the detached job took {took:.1f} s")
        assert shown.returncode == 0, shown.stderr
        report = json.loads(shown.stdout)
        assert report["hang"]["odd_ranks"] == [odd] and report["hang"]["collection_s"] < 10, report["hang"]
        assert [s["rank"] for s in report["stacks"]] == list(range(NP))
        assert {s["worker"] for s in report["stacks"]} == {f"{name}-worker-0", f"{name}-worker-1"}
        assert stacks_keys_left(app_id, openmpi_env) == []  # the launcher took the requests, the asker the replies
        assert app_by_name(yarn, name)["state"] == "RUNNING"  # the job runs on
    finally:
        deleted = cli(openmpi_env["env"], "delete", name, "--backend", "yarn")
    assert deleted.returncode == 0, deleted.stderr
    assert f"killed {app_id} ({name})" in deleted.stdout, deleted.stdout
    assert_released(yarn, name, "KILLED")
    # once the job is gone: one error line and a hint, exit 2
    gone, _ = stacks_command(name, openmpi_env, tmp_path)
    assert gone.returncode == 2, gone.stdout + gone.stderr
    first, hint = gone.stderr.splitlines()
    assert first == f"mpilaunch: error: job {name} ({app_id}) has ended (Killed)", gone.stderr
    assert hint.startswith("  hint: ") and f"mpilaunch logs {name}" in hint, hint
    unknown, _ = stacks_command("yarn-hang-no-such-job", openmpi_env, tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.startswith("mpilaunch: error: no mpilaunch job named 'yarn-hang-no-such-job' on YARN")


@pytest.mark.timeout(600)
def test_yarn_hang_detached_stall_timeout_names_the_rank_and_wait_returns_hung(yarn, openmpi_env):
    """--stall-timeout reaches a detached launcher container (the launch description dropped it: the
    job ran to its --timeout). It names the rank in its log, stops the job, and `mpilaunch wait`
    returns 86 long before --timeout."""
    name, odd = "yarn-hang-detached-stall", 2
    args = ["--name", name, "--np", str(NP), "--slots-per-worker", str(SLOTS), "--memory", "512 MiB"]
    proc = start(
        [*args, "--detach", "--stall-timeout", "15", "--timeout", "360", "--",
         sys.executable, str(HANG), "sleep", str(odd)],
        openmpi_env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err + describe_app(yarn, name)
    started = time.monotonic()
    waited = cli(openmpi_env["env"], "wait", name, "--backend", "yarn", timeout=400)
    took = time.monotonic() - started
    logs = cli(openmpi_env["env"], "logs", name, "--backend", "yarn").stdout
    assert waited.returncode == EXIT_HUNG, waited.stdout + waited.stderr + logs[-3000:] + describe_app(yarn, name)
    assert took < 300, f"wait took {took:.0f} s: the stall was not found before --timeout"
    verdict = (
        f"mpilaunch: hang: rank {odd} ({name}-worker-1) is in time.sleep at hang.py:{STUCK['sleep']}; "
        f"the 3 other ranks are in MPI_Allreduce at hang.py:{STUCK['others']}"
    )
    assert verdict in logs.splitlines(), logs[-3000:]
    assert_released(yarn, name, "FAILED")
