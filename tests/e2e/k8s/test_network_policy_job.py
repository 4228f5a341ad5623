"""The job's own NetworkPolicy on real pods, behind a default-deny namespace (marker ``real_pods``; issue 40).

The testbed's enforcer (kube-router's policy controller, ``testbeds/k8s/netpol.py``) is proven
on its own in ``test_network_policy_testbed.py``. Here: a tenant's job runs through the
namespace's default deny because of its policy, and a pod outside the job cannot reach a
worker's agent while the job runs.
"""

from __future__ import annotations

import json
import uuid

import pytest

from support.helpers import wait_started
from support.real_pods import finish, pods_of, stop
from support.tenant import PLACEMENT, tenant_pods

pytestmark = pytest.mark.real_pods

AGENT_PORT = 7355
# an outsider's connection attempt: "refused" or "timeout" (either way, not connected), or "connected"
PROBE = (
    "import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    print('connected')\nexcept ConnectionRefusedError:\n    print('refused')\n"
    "except OSError as e:\n    print('timeout', e)\n"
)


@pytest.fixture
def outsider(real):
    """A pod of no job, in a namespace without policies (its egress is open), on the real node."""
    name = f"np-outsider-{uuid.uuid4().hex[:6]}"
    overrides = {
        "spec": {
            "nodeSelector": {"mpilaunch.testbed/real-pods": "true"},
            "tolerations": [
                {"key": "mpilaunch.testbed/real-pods", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
            ],
        }
    }
    real.kubectl(
        "run",
        name,
        "--image",
        real.image,
        "--restart=Never",
        "--overrides",
        json.dumps(overrides),
        "--command",
        "--",
        "sleep",
        "600",
    )
    real.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
    yield name
    real.kubectl("delete", "pod", name, "--wait=false", check=False)


def probe(real, pod: str, ip: str, port: int) -> str:
    return real.kubectl("exec", pod, "--", "python3", "-c", PROBE, ip, str(port), timeout=30).stdout.strip()


def test_network_policy_keeps_an_outsider_from_a_workers_agent(tenant, outsider, real):
    """While a tenant's job runs (its workers' agents listening on 7355), a pod outside the job
    cannot connect to them; the job itself, whose launcher does, succeeds; its policy is owned by
    the job's root and goes with it."""
    job = "np-outsider-job"
    proc = tenant.start(
        job,
        *PLACEMENT,
        "--",
        "python3",
        "-c",
        "import time; from mpi4py import MPI; MPI.COMM_WORLD.barrier(); print('ranks up', flush=True); "
        "time.sleep(12); MPI.COMM_WORLD.barrier()",
    )
    try:
        up = wait_started(proc, 4, "ranks up")  # every rank runs: the agents listen
        policy = json.loads(tenant.kubectl("get", "networkpolicy", job, "-o", "json").stdout)
        assert [o["kind"] for o in policy["metadata"]["ownerReferences"]] == ["ConfigMap"]
        worker = next(p for n, p in tenant_pods(tenant, job).items() if n.endswith("-worker-0"))
        # the agent listens (the launcher reaches it) while the job runs: an outsider never connects
        verdicts = [probe(real, outsider, worker["status"]["podIP"], AGENT_PORT) for _ in range(3)]
        out, err = finish(proc, 180)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, "".join(up)[-1000:] + out[-2000:] + err[-3000:]
    assert verdicts and all(v.split()[0] in ("refused", "timeout") for v in verdicts), verdicts
    assert tenant.leftovers(job) == []  # the NetworkPolicies among them


def test_network_policy_lets_an_outsider_in_where_the_job_made_none(real, outsider, tmp_path):
    """The control: the same probe connects to a worker's agent of a job run with
    --network-policy none in a namespace without policies, so the refusal above is the job's
    policy and not a closed port."""
    job = "np-none"
    proc = real.start(
        job,
        "--network-policy",
        "none",
        *PLACEMENT,
        "--",
        "python3",
        "-c",
        "import time; from mpi4py import MPI; MPI.COMM_WORLD.barrier(); print('ranks up', flush=True); "
        "time.sleep(12); MPI.COMM_WORLD.barrier()",
    )
    try:
        wait_started(proc, 4, "ranks up")  # every rank runs: the agents listen
        worker = next(p for n, p in pods_of(real, job).items() if n.endswith("-worker-0"))
        assert real.kubectl("get", "networkpolicy", "-l", f"mpilaunch/job={job}", "-o", "name").stdout == ""
        verdict = probe(real, outsider, worker["status"]["podIP"], AGENT_PORT)
        out, err = finish(proc, 180)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert verdict == "connected"
    assert real.leftovers(job) == []
