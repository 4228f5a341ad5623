"""The submitting side let into the job's NetworkPolicies through the real API server (kwok
testbed; issue 49 item 9): exactly the launch's traffic, once, however often a relaunch asks.

``tests/unit/test_k8s_network_policy.py`` has every shape of launch against a scripted API; here
the policies are the API server's own objects, as it stores and returns them (a rule that the
server normalised would not be recognised as present, and would be appended again).
"""

from __future__ import annotations

import sys
import time

import pytest

from mpilaunch.backends.k8s.backend import K8sBackend
from mpilaunch.backends.k8s.options import K8sOptions
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from support.backend_contract import ready
from support.k8s import leftover_objects

pytestmark = pytest.mark.k8s


@pytest.fixture
def backend(kube, monkeypatch, tmp_path):
    # kwok runs the pods' commands on this machine, where mpilaunch is (as the k8s_env fixture says)
    monkeypatch.setenv("MPILAUNCH_K8S_TOOLS", "image")
    monkeypatch.setenv("MPILAUNCH_K8S_PYTHON", sys.executable)
    job = "np-submitter"
    # strict: <job>-egress exists in any namespace; agent: this side's shims connect in as well
    options = K8sOptions(
        image="mpilaunch:test", kubeconfig=str(kube.kubeconfig), network_policy="strict", transport="agent"
    )
    spec = JobSpec(command=("true",), backend="k8s", launcher="local", name=job, backend_options=options)
    rundir = tmp_path / "rundir"
    rundir.mkdir()
    made = K8sBackend(spec, Plan(job, tuple(WorkerPlan(f"{job}-worker-{i}", 2, 0) for i in range(2))), rundir)
    yield made
    made.release()
    assert leftover_objects(kube, job) == []


def test_network_policy_submitter_rule_through_the_api_server_once_per_job(kube, backend):
    ready(backend, timeout=120)
    address = backend.control_address()
    assert address
    peer = [{"ipBlock": {"cidr": f"{address}/32"}}]

    def specs() -> dict:
        return {name: kube.get_json("networkpolicy", name)["spec"] for name in ("np-submitter", "np-submitter-egress")}

    first = specs()
    own = [{"podSelector": {"matchLabels": {"mpilaunch/job": "np-submitter"}}}]
    # in: only the agents' port; out: only TCP (mpirun's ephemeral ports), nothing else either way
    assert first["np-submitter"]["ingress"] == [
        {"from": own},
        {"from": peer, "ports": [{"protocol": "TCP", "port": 7355}]},
    ]
    assert first["np-submitter-egress"]["egress"][-1] == {"to": peer, "ports": [{"protocol": "TCP"}]}
    assert [r for r in first["np-submitter-egress"]["egress"] if r.get("to") == peer] == [
        first["np-submitter-egress"]["egress"][-1]
    ]
    for _ in range(2):  # a relaunch with replacement workers waits for them, and lets this side in again
        backend.wait_ready(time.monotonic() + 60, lambda ready, total, note=None: None)
    assert specs() == first
    print(f"submitter {address}: DNS rule {first['np-submitter-egress']['egress'][1]}")
