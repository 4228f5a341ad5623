"""Hung jobs on YARN: the verdict names the rank injected to hold the job up (issue 42).

tests/programs/hang.py makes one chosen rank sleep before the allreduce (or
wait in MPI_Recv) while the others wait in MPI; 4 ranks on 2 worker
containers. With ``--launcher local`` mpirun runs here; with the cluster
launcher it runs in the launcher container. Either way the submitting
mpilaunch reaches the workers' agents (their addresses and the job's secret
are its own), so the --timeout diagnosis is taken from here, before the stop,
and ``mpilaunch stacks NAME --backend yarn`` works through that mpilaunch's
run directory. Open MPI 5 (the YARN fixtures' MPI).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.helpers import PROGRAMS, REPO, finish, mpilaunch_env, wait_started
from support.yarn import assert_released, describe_app, start

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
        shown = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "stacks", name, "--backend", "yarn"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=openmpi_env["env"],
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"ranks 0-2: MPI_Allreduce <- <module> (hang.py:{STUCK['others']})", shown.stdout
        assert lines[1] == f"rank 3: time.sleep <- <module> (hang.py:{STUCK['sleep']})", shown.stdout
        assert lines[2].startswith(f"mpilaunch: hang: rank 3 ({name}-worker-1) is in time.sleep"), shown.stdout
        assert proc.poll() is None  # the job runs on
        # the same job by another backend's name: not found
        wrong = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "stacks", name, "--backend", "local"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=mpilaunch_env(),
            timeout=60,
        )
        assert wrong.returncode == 2
        assert wrong.stderr.startswith(f"mpilaunch: error: no running local job named {name!r}"), wrong.stderr
    finally:
        proc.terminate()
        finish(proc, 90)
    assert_released(yarn, name, "KILLED")
