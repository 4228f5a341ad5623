"""--pod-template on real pods, as a tenant of a locked-down namespace (marker ``real_pods``; issue 40).

The merge itself is tested rule by rule in tests/unit/test_k8s_pod_template.py; these show that
what a user puts in a template reaches the running pods and the ranks, and that the pods are still
admitted under PodSecurity ``restricted``, the quota and the LimitRange.
"""

from __future__ import annotations

import json

import pytest

from support.real_pods import ranks_from
from support.tenant import PLACEMENT, run_watching

pytestmark = pytest.mark.real_pods

TEMPLATE = """\
# every role
spec:
  imagePullSecrets: [{name: regcred}]
---
kind: Pod
metadata:
  labels: {mpilaunch/role: worker, team: vision}
  annotations: {example.com/owner: alice}
spec:
  containers:
  - name: worker
    env:
    - name: DATASET_TOKEN
      valueFrom: {secretKeyRef: {name: dataset-token, key: token}}
    volumeMounts:
    - {name: dataset, mountPath: /data, readOnly: true}
    securityContext: {readOnlyRootFilesystem: true}
  volumes:
  - name: dataset
    configMap: {name: dataset-index}
---
kind: Pod
metadata:
  labels: {mpilaunch/role: launcher}
  annotations: {example.com/role: launcher}
"""

PROGRAM = (
    "import os, json\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
    "print(json.dumps({'rank': c.rank, 'sum': c.allreduce(c.rank + 1), "
    "'token': os.environ.get('DATASET_TOKEN'), 'index': open('/data/index').read().strip()}))"
)


def test_pod_template_env_from_a_secret_and_a_volume_reach_every_rank(tenant, tmp_path):
    """A worker template's env from a Secret and a ConfigMap volume are what the ranks see; its labels,
    annotations and read-only root are on the pods; the launcher's own template is its alone; the
    reaper takes the pull secret; everything is still admitted under 'restricted' and the quota."""
    tenant.kubectl("create", "secret", "generic", "dataset-token", "--from-literal=token=s3cr3t-77")
    tenant.kubectl("create", "configmap", "dataset-index", "--from-literal=index=shard-0..shard-9")
    template = tmp_path / "pods.yaml"
    template.write_text(TEMPLATE)
    job = "pt-pods"
    code, out, err, seen = run_watching(
        tenant, job, "--pod-template", str(template), *PLACEMENT, "--", "python3", "-c", PROGRAM
    )
    assert code == 0, out[-2000:] + err[-3000:]
    ranks = ranks_from(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["sum"] for r in ranks} == {10}, ranks
    assert {(r["token"], r["index"]) for r in ranks} == {("s3cr3t-77", "shard-0..shard-9")}
    workers = [p for n, p in seen.items() if "-worker-" in n]
    launcher = next(p for n, p in seen.items() if "-launcher" in n)
    assert len(workers) == 2
    for pod in workers:
        assert pod["metadata"]["labels"]["team"] == "vision"
        assert pod["metadata"]["annotations"]["example.com/owner"] == "alice"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "team" not in launcher["metadata"]["labels"]
    assert launcher["metadata"]["annotations"]["example.com/role"] == "launcher"
    assert tenant.leftovers(job) == []


def test_pod_template_field_mpilaunch_owns_is_one_line_and_nothing_is_made(tenant, tmp_path):
    template = tmp_path / "bad.yaml"
    template.write_text("spec:\n  containers:\n  - name: worker\n    command: [sleep, '1']\n")
    job = "pt-owned"
    result = tenant.run(job, "--pod-template", str(template), *PLACEMENT, "--", "true", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("mpilaunch: error:")]
    assert len(lines) == 1 and "command" in lines[0] and str(template) in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert tenant.objects_of(job) == []


def test_pod_template_sidecar_in_a_restricted_namespace_is_admitted(tenant, tmp_path):
    """A user's sidecar (a log shipper) in the worker template gets mpilaunch's restricted
    securityContext under its own, so the namespace admits it; the job runs and is released."""
    template = tmp_path / "sidecar.yaml"
    # mpilaunch's container first (by name), the sidecar after it
    template.write_text(
        "metadata:\n  labels: {mpilaunch/role: worker}\nspec:\n  containers:\n  - name: worker\n"
        '  - name: shipper\n    image: IMAGE\n    command: [/bin/sh, -c, \'trap "exit 0" TERM; '
        "while :; do sleep 1; done']\n    resources: {limits: {cpu: 50m, memory: 32Mi}, "
        "requests: {cpu: 50m, memory: 32Mi}}\n".replace("IMAGE", tenant.real.image)
    )
    job = "pt-sidecar"
    code, out, err, seen = run_watching(
        tenant,
        job,
        "--pod-template",
        str(template),
        *PLACEMENT,
        "--",
        "python3",
        "/opt/mpilaunch/tests/programs/placement.py",
    )
    assert code == 0, out[-2000:] + err[-3000:]
    workers = [p for n, p in seen.items() if "-worker-" in n]
    names = [[c["name"] for c in p["spec"]["containers"]] for p in workers]
    assert names and all(n[0] == "worker" and "shipper" in n for n in names), names
    shipper = next(c for c in workers[0]["spec"]["containers"] if c["name"] == "shipper")
    assert shipper["securityContext"]["allowPrivilegeEscalation"] is False, json.dumps(shipper)
    assert tenant.leftovers(job) == []
