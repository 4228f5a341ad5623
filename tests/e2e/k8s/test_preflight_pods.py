"""--preflight on real pods (marker ``real_pods``): the probe reaches every worker pod through the
job's exec channel, a finding is one line per worker and a Warning Event (reason Preflight) on that
worker's pod, where ``kubectl describe pod`` shows it.

No GPU exists on the test machines (nor a GPU resource on the real node): a stand-in ``nvidia-smi``,
from a ConfigMap the worker template mounts on the image's PATH, reports a GPU with uncorrected ECC
errors and a thermal slowdown. That is the one thing faked, said so here as the project's rules ask;
the pods, the exec channel, the probe and the Events are real.
"""

from __future__ import annotations

import json

import pytest

from support.real_pods import fake_smi_template

pytestmark = pytest.mark.real_pods

FAKE_SMI = """#!/bin/sh
case "$*" in
  *ecc*) printf '0, NVIDIA H100 80GB HBM3, 3, 0x0000000000000040\\n' ;;
  *) printf '0\\n' ;;
esac
"""
UNHEALTHY_GPU_TEMPLATE = fake_smi_template("pf-fake-smi")


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: preflight:")]


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_preflight_pods_an_unhealthy_gpu_is_named_on_each_worker_and_enforce_ends_the_job(real, tmp_path, launcher):
    job = f"pf-pods-{launcher}"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    real.kubectl("delete", "configmap", "pf-fake-smi", "--ignore-not-found")
    real.kubectl("create", "configmap", "pf-fake-smi", f"--from-file=nvidia-smi={smi}")
    template = tmp_path / "pods.yaml"
    template.write_text(UNHEALTHY_GPU_TEMPLATE)
    # mpirun on this machine must start its daemons in the pods, at its own path: the image's
    # Open MPI 4 (this machine's venv Open MPI 5 is not in the image, and the link test, run
    # under the job's own mpirun, would rightly fail on every worker with it)
    here = ["--mpirun", "/usr/bin/mpirun.openmpi"] if launcher == "local" else []
    p = real.run(
        job, "--np", "2", "--slots-per-worker", "1", "--launcher", launcher, "--pod-template", str(template),
        *here, "--preflight", "enforce", "--", "python3", "-c", "print('PROGRAM-RAN')",
    )  # fmt: skip
    assert p.returncode == 6, p.stderr[-3000:]
    assert "PROGRAM-RAN" not in p.stdout
    lines = sorted(preflight_lines(p.stderr))
    assert len(lines) == 4, p.stderr[-3000:]  # the GPU's two on each worker; the links passed
    for i in range(2):
        head = f"mpilaunch: preflight: worker {job}-worker-{i} (node "
        mine = [line for line in lines if line.startswith(head)]
        assert [line.split(") ", 1)[1] for line in mine] == [
            "GPU 0 (NVIDIA H100 80GB HBM3) has 3 uncorrected ECC errors",
            "GPU 0 (NVIDIA H100 80GB HBM3) is throttled: HW thermal slowdown",
        ], lines
    events = json.loads(real.kubectl("get", "events", "--field-selector", "reason=Preflight", "-o", "json").stdout)
    on = sorted(e["involvedObject"]["name"] for e in events["items"] if e["involvedObject"]["name"].startswith(job))
    assert on == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2, events
    assert real.leftovers(job) == [], p.stderr[-2000:]
