"""PS mode on the Kubernetes backend: one pod per task, ClusterSpec through the exec API.

kwok runs exec'd commands as local processes (no container runtime here), so
each task's pod gets its own POD_NAME through kwok's per-pod exec config, the
way a real pod has its own environment; the test then proves each task ran
through its own pod's exec.
"""

import json
import sys

import pytest

from support.helpers import leftover_processes, run_mpilaunch

pytestmark = [pytest.mark.k8s, pytest.mark.ps]

TASK_PROGRAM = (
    "import json, os, time; cfg = json.loads(os.environ['TF_CONFIG']); t = cfg['task']; "
    "print('TASK ' + json.dumps({'task': t, 'pod': os.environ.get('POD_NAME'), 'cluster': cfg['cluster']}), "
    "flush=True); time.sleep(300) if t['type'] == 'ps' else None"
)
TASKS = ("chief-0", "worker-0", "worker-1", "ps-0")


def test_ps_tasks_run_in_their_pods_and_nothing_is_left(kube, k8s_env, tmp_path):
    name = "psk8s"
    for task in TASKS:
        kube.set_pod_exec(f"{name}-{task}", env={"POD_NAME": f"{name}-{task}"})
    proc = run_mpilaunch(
        [
            "--backend",
            "k8s",
            "--launcher",
            "local",
            "--image",
            "mpilaunch:test",
            "--name",
            name,
            "--mode",
            "ps",
            "--chief",
            "--workers",
            "2",
            "--ps",
            "1",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            "-c",
            TASK_PROGRAM,
        ],
        env_extra=k8s_env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tasks = [json.loads(line.split("TASK ", 1)[1]) for line in proc.stdout.splitlines() if "TASK {" in line]
    assert {f"{t['task']['type']}-{t['task']['index']}": t["pod"] for t in tasks} == {
        task: f"{name}-{task}" for task in TASKS
    }
    assert len({json.dumps(t["cluster"], sort_keys=True) for t in tasks}) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert {t["task"]: t["status"] for t in report["tasks"]}["ps:0"] == "terminated"
    left = kube.kubectl(
        "get", "pods,configmaps,services,serviceaccounts", "-l", f"mpilaunch/job={name}", "-o", "name"
    ).stdout.split()
    assert left == []
    assert leftover_processes(name) == []


def test_ps_mode_creates_no_launcher_job(tmp_path):
    """PS mode's registry is mpilaunch itself, so on Kubernetes, as on YARN, it
    never gets a launcher Job, whatever --launcher says (it used to get one
    that would have run mpirun over the task pods)."""
    for launcher in ("auto", "cluster"):
        proc = run_mpilaunch(
            [
                "--backend",
                "k8s",
                "--image",
                "mpilaunch:test",
                "--name",
                "psdry",
                "--mode",
                "ps",
                "--chief",
                "--workers",
                "1",
                "--ps",
                "1",
                "--launcher",
                launcher,
                "--dry-run",
                "--",
                "python3",
                "train.py",
            ],
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        kinds = [line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("kind:")]
        assert kinds.count("Pod") == 3, kinds
        assert "psdry-launcher" not in proc.stdout  # neither its Job nor its pod (the reaper Job may be there)
