"""--spares on real pods (marker ``real_pods``): spare worker pods wait beside the job's, outside the
hostfile; one takes the place of a worker pod that is deleted under ``--retries``, or that
``--preflight enforce`` rejects, without waiting for the scheduler, the image or the container.

mpirun runs on this machine (``--launcher local``, the image's Open MPI 4.1, as the other local
launcher tests on real pods). The one thing faked: no GPU exists here, so a stand-in
``nvidia-smi`` (a ConfigMap the worker template mounts) reports an unhealthy GPU on the pod whose
host name is worker 1's, and a healthy one elsewhere (said so, as the project's rules ask).
"""

from __future__ import annotations

import json
import time

import pytest

from support.helpers import wait_for, wait_started
from support.real_pods import fake_smi_template

pytestmark = pytest.mark.real_pods

PROGRAMS = "/opt/mpilaunch/tests/programs"  # where the image has them
HERE = ("--launcher", "local", "--mpirun", "/usr/bin/mpirun.openmpi")
BAD_ON_WORKER_1 = """#!/bin/sh
case "$(hostname)" in
  *-worker-1) bad='3, 0x0000000000000040' ;;
  *) bad='0, 0x0000000000000000' ;;
esac
case "$*" in
  *ecc*) printf '0, NVIDIA H100 80GB HBM3, %s\\n' "$bad" ;;
  *) printf '0\\n' ;;
esac
"""
FAKE_SMI_TEMPLATE = fake_smi_template("spare-fake-smi")


def uid_of(real, pod: str) -> str:
    return real.kubectl("get", "pod", pod, "-o", "jsonpath={.metadata.uid}", check=False).stdout.strip()


def launcher_pods_made(real, job: str, since: str) -> list[str]:
    """The pods the launcher Job's controller made since ``since`` (UTC, "%Y-%m-%dT%H:%M:%SZ"), from
    its Events, which outlive the job (and an earlier run's job of the same name)."""
    said = real.kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={job}-launcher,reason=SuccessfulCreate",
        "-o", "jsonpath={range .items[*]}{.firstTimestamp} {.message}{'\\n'}{end}", check=False,
    ).stdout  # fmt: skip
    return [line.rsplit(" ", 1)[-1] for line in said.splitlines() if line.strip() and line.split(" ", 1)[0] >= since]


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_spare_pod_takes_the_place_of_a_deleted_worker_pod_at_once(real, tmp_path, launcher):
    # cluster: the launcher pod swaps the spare in itself and runs mpirun again (no new launcher pod)
    job = f"sp-pods-lost-{launcher}"
    here = HERE if launcher == "local" else ("--launcher", "cluster")
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    proc = real.start(
        job, "--np", "2", "--slots-per-worker", "1", *here, "--retries", "1", "--spares", "1",
        "--output-dir", str(tmp_path), "-x", "SLEEP=300", "--", "python3", f"{PROGRAMS}/attempts.py",
    )  # fmt: skip
    try:
        seen = wait_started(proc, 2, "started (first attempt)", timeout=240)
        wait_for(lambda: uid_of(real, f"{job}-spare-0") != "", 60, "the spare pod")
        spare_uid = uid_of(real, f"{job}-spare-0")
        real.kubectl("delete", "pod", f"{job}-worker-1", "--wait=false")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(seen) + out
    assert proc.returncode == 0, err[-3000:]
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (lost)" in err, err[-3000:]
    # the relaunched rank runs in the spare pod and says the worker of the plan
    assert f"started (relaunch) on {job}-worker-1 as attempt 2" in out, out
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(a["exit_code"], a["lost_workers"]) for a in report["attempts"]] == [(5, [f"{job}-worker-1"]), (0, [])]
    assert report["workers"][f"{job}-worker-1"]["pod"] == f"{job}-spare-0"
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        (f"{job}-worker-1", f"{job}-spare-0", "lost")
    ]
    assert spare_uid and report["ranks"]  # the spare that waited is the pod that served
    if launcher == "cluster":  # the launcher pod lived on: one pod made by its Job in the whole job
        assert len(launcher_pods_made(real, job, since)) == 1, launcher_pods_made(real, job, since)
    assert real.leftovers(job) == [], err[-2000:]  # spare-1, asked for after the swap, is gone too


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_spare_pod_replaces_the_worker_preflight_rejects_and_the_job_runs(real, tmp_path, launcher):
    # cluster: the preflight runs in the launcher pod, which swaps the spare in itself
    job = f"sp-pods-pf-{launcher}"
    here = HERE if launcher == "local" else ("--launcher", "cluster")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(BAD_ON_WORKER_1)
    real.kubectl("delete", "configmap", "spare-fake-smi", "--ignore-not-found")
    real.kubectl("create", "configmap", "spare-fake-smi", f"--from-file=nvidia-smi={smi}")
    template = tmp_path / "pods.yaml"
    template.write_text(FAKE_SMI_TEMPLATE)
    p = real.run(
        job, "--np", "2", "--slots-per-worker", "1", *here, "--pod-template", str(template),
        "--spares", "1", "--preflight", "enforce", "--output-dir", str(tmp_path / "out"),
        "--", "python3", "-c", "import os; print('RAN', os.environ['MPILAUNCH_WORKER'], os.uname().nodename)",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"mpilaunch: spare {job}-spare-0 takes the place of worker {job}-worker-1 (preflight)" in p.stderr
    ran = sorted(line.split("] ", 1)[-1] for line in p.stdout.splitlines() if "RAN" in line)
    assert ran == [f"RAN {job}-worker-0 {job}-worker-0", f"RAN {job}-worker-1 {job}-spare-0"], p.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(s["worker"], s["spare"], s["why"]) for s in report["spares"]["swaps"]] == [
        (f"{job}-worker-1", f"{job}-spare-0", "preflight")
    ]
    assert report["workers"][f"{job}-worker-1"]["pod"] == f"{job}-spare-0"
    if launcher == "local":  # the findings of each check (the launcher pod's are its lines, above)
        assert [r["failed_workers"] for r in report["preflight"]["swapped_rounds"]] == [[f"{job}-worker-1"]]
        assert report["preflight"]["failed_workers"] == []
    assert real.leftovers(job) == [], p.stderr[-2000:]


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ("--launcher", "cluster", "--preflight", "enforce", "--service-account", "default"),
            "--spares with the launcher pod needs the job's own Role",
        ),
        (
            HERE + ("--preflight", "enforce", "--queue", "lq"),
            "--spares cannot be used with --queue: Kueue admits the job's pods as one group",
        ),
    ],
)
def test_spare_pods_refused_where_not_kept_yet_with_nothing_created(real, args, said):
    job = "sp-pods-no"
    p = real.run(job, "--np", "2", *args, "--spares", "1", "--", "true")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"mpilaunch: error: {said}"), p.stderr
    assert real.leftovers(job, timeout=1) == []
