"""A detached Kubernetes job's closing summary: its launcher posts it, `mpilaunch wait` prints it.

On the kwok testbed, playing the kubelet for the launcher pod as test_k8s.py
does: the launcher's own entry point runs here with the pod's in-cluster
environment (its ServiceAccount's token) and, the job being detached,
records the outcome in the root ConfigMap's result.json, now with the
summary's facts (``summary.compact``), and ends its log (what ``mpilaunch
logs`` shows; kwok serves no pod logs, so its stderr is read here) with the
summary itself. The real-pod tests (test_real_pods.py -k detach) read it
through `mpilaunch logs` too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.helpers import REPO, wait_for
from support.k8s import end_launcher_pod, in_cluster_env, launcher_files, leftover_objects, manage_k8s, start

pytestmark = pytest.mark.k8s


def launcher_pod(kube, name):
    pods = kube.get_json("pods", "-l", f"mpilaunch/job={name},mpilaunch/role=launcher")["items"]
    return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None


@pytest.mark.parametrize("code", [0, 7])
def test_run_summary_detached_k8s_wait_prints_what_the_launcher_posted(kube, k8s_env, tmp_path, code):
    job = f"k8s-summary-{code}"
    program = [sys.executable, "tests/programs/fail_rank.py"] if code else ["true"]
    submitted = start(
        ["--name", job, "--np", "2", "--slots-per-worker", "1", "--transport", "exec", "--detach", "-q", "--no-verify",
         "-x", "FAIL_RANK=1", "-x", "FAIL_CODE=7", "-x", "SLEEP=0", "--", *program],
        k8s_env,
    )  # fmt: skip
    out, err = submitted.communicate(timeout=180)
    try:
        assert submitted.returncode == 0, err[-3000:]
        pod = wait_for(lambda: launcher_pod(kube, job), 120, "the launcher pod")
        ran = subprocess.run(
            # the launcher pod's own command (python3 -m MODULE LAUNCH_JSON), with this machine's python
            [sys.executable, *pod["spec"]["containers"][0]["command"][1:3], str(launcher_files(kube, job, tmp_path))],
            cwd=REPO,
            env=in_cluster_env(kube, k8s_env, f"{job}-launcher", tmp_path / "sa"),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert ran.returncode == code, ran.stderr[-3000:]
        end_launcher_pod(kube, pod, ran.returncode)
        verdict = "succeeded" if code == 0 else f"failed (exit {code})"
        # the launcher's log ends with the summary (what `mpilaunch logs NAME` prints)
        log = ran.stderr.splitlines()
        head = next(i for i, line in enumerate(log) if line.startswith(f"mpilaunch: job {job} {verdict} in "))
        assert log[head + 1].startswith("  2 ranks on 2 workers;") and log[head + 1].endswith("; backend k8s"), log
        assert log[head + 2].startswith("  time: "), log[head:]
        assert log[-1].startswith("  ledger: "), log[head:]

        result = json.loads(kube.get_json("configmap", job)["data"]["result.json"])
        posted = result["summary"]
        assert posted["exit_code"] == code and posted["plan"] == {"ranks": 2, "gpus": 0, "workers": 2}
        assert set(posted["timings"]) == {"total_s", "phases"} and "ranks" not in posted
        assert len(json.dumps(posted)) < 2000

        waited = manage_k8s(k8s_env, "wait", job)
        assert waited.returncode == code, waited.stdout + waited.stderr
        lines = waited.stderr.splitlines()
        failure = "rank 1 on worker ? exited with code 7"  # kwok's exec sets no MPILAUNCH_WORKER: "?"
        if code:  # the failure (and its rank's last lines) first, as before
            assert lines[0] == f"mpilaunch: error: {failure}", lines
        at = next(i for i, line in enumerate(lines) if line.startswith(f"mpilaunch: job {job} {verdict} in "))
        assert lines[at].endswith(failure) == bool(code), lines[at]
        assert lines[at:] == log[head:], (lines, log)  # the summary the launcher printed, line for line
        assert f"job {job} {'succeeded' if code == 0 else 'failed'} (exit {code}) after " in waited.stdout
    finally:
        manage_k8s(k8s_env, "delete", job)
    assert leftover_objects(kube, job) == []
