"""PS mode on the YARN backend: one YARN container per task, real TensorFlow.

The registry is the launcher, reached through the same exec channel (the
agents in the containers) as on the local backend.
"""

import importlib.util
import json
import sys

import pytest

from support.helpers import run_mpilaunch
from support.mpi_installs import require
from support.yarn import assert_released

pytestmark = [pytest.mark.yarn, pytest.mark.ps]

TASK_PROGRAM = (
    "import json, os, time; cfg = json.loads(os.environ['TF_CONFIG']); t = cfg['task']; "
    "print('TASK ' + json.dumps({'task': t, 'container': os.environ.get('CONTAINER_ID'), "
    "'cluster': cfg['cluster']}), flush=True); "
    "time.sleep(300) if t['type'] == 'ps' else None"
)


def tasks_from(stdout):
    return [json.loads(line.split("TASK ", 1)[1]) for line in stdout.splitlines() if "TASK {" in line]


def test_each_task_runs_in_its_own_container_and_ps_is_terminated(yarn, openmpi_env, tmp_path):
    name = "psyarn-life"
    proc = run_mpilaunch(
        [
            "--backend",
            "yarn",
            "--launcher",
            "local",
            "--name",
            name,
            "--mode",
            "ps",
            "--chief",
            "--workers",
            "2",
            "--ps",
            "1",
            "--memory",
            "256 MiB",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "-c",
            TASK_PROGRAM,
        ],
        env_extra=openmpi_env["env"],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tasks = tasks_from(proc.stdout)
    assert sorted(f"{t['task']['type']}:{t['task']['index']}" for t in tasks) == [
        "chief:0",
        "ps:0",
        "worker:0",
        "worker:1",
    ]
    assert len({t["container"] for t in tasks}) == 4 and all(t["container"] for t in tasks)
    assert len({json.dumps(t["cluster"], sort_keys=True) for t in tasks}) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    status = {t["task"]: t["status"] for t in report["tasks"]}
    assert status["ps:0"] == "terminated" and status["chief:0"] == "succeeded"
    assert_released(yarn, name, "SUCCEEDED")


def test_keras_parameter_server_training_on_yarn(yarn, openmpi_env, tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        require("tensorflow not installed (pip install 'mpilaunch[ps]')")
    name = "psyarn-keras"
    out = tmp_path / "train"
    proc = run_mpilaunch(
        [
            "--backend",
            "yarn",
            "--launcher",
            "local",
            "--name",
            name,
            "--mode",
            "ps",
            "--chief",
            "--workers",
            "2",
            "--ps",
            "1",
            "--memory",
            "1 GiB",
            "-o",
            str(out),
            "--output-dir",
            str(tmp_path / "logs"),
            "--timeout",
            "400",
            "-q",
            "-s",
            "examples/ps_keras.py",
            # -s ships the script into every container (YARN-DTF's DTF_TASK_SCRIPT)
            "--",
            sys.executable,
            "$DTF_TASK_SCRIPT",
            "--steps",
            "8",
        ],
        env_extra=openmpi_env["env"],
        timeout=480,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "ps_keras.json").read_text())
    report = json.loads((tmp_path / "logs" / "report.json").read_text())
    assert summary["cluster"] == report["cluster"]
    assert summary["steps"] == 8 and summary["loss_after"] < summary["loss_before"]
    assert summary["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    assert_released(yarn, name, "SUCCEEDED")
