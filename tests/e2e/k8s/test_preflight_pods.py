"""--preflight on real pods (marker ``real_pods``): the probe reaches every worker pod through the
job's exec channel, a finding is one line per worker and a Warning Event (reason Preflight) on that
worker's pod, where ``kubectl describe pod`` shows it.

The finding is made real, not faked: the worker template points the containers' TMPDIR at the
pod's /dev/shm, the container runtime's 64 MiB tmpfs, under the 1 GiB of scratch the check asks for.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.real_pods

SMALL_SCRATCH = """\
kind: Pod
metadata:
  labels: {mpilaunch/role: worker}
spec:
  containers:
  - name: worker
    env:
    - {name: TMPDIR, value: /dev/shm}
"""


def preflight_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: preflight:")]


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_preflight_pods_small_scratch_is_named_on_each_worker_and_enforce_ends_the_job(real, tmp_path, launcher):
    job = f"pf-pods-{launcher}"
    template = tmp_path / "pods.yaml"
    template.write_text(SMALL_SCRATCH)
    p = real.run(
        job, "--np", "2", "--slots-per-worker", "1", "--launcher", launcher, "--pod-template", str(template),
        "--preflight", "enforce", "--", "python3", "-c", "print('PROGRAM-RAN')",
    )  # fmt: skip
    assert p.returncode == 6, p.stderr[-3000:]
    assert "PROGRAM-RAN" not in p.stdout
    lines = preflight_lines(p.stderr)
    assert len(lines) == 2, p.stderr[-3000:]
    for i, line in enumerate(sorted(lines)):
        assert line.startswith(f"mpilaunch: preflight: worker {job}-worker-{i} (node "), line
        assert " scratch /dev/shm has " in line and line.endswith(" free, under 1.00 GiB"), line
    events = json.loads(real.kubectl("get", "events", "--field-selector", "reason=Preflight", "-o", "json").stdout)
    on = sorted(e["involvedObject"]["name"] for e in events["items"] if e["involvedObject"]["name"].startswith(job))
    assert on == [f"{job}-worker-0", f"{job}-worker-1"], events
    assert real.leftovers(job) == [], p.stderr[-2000:]
