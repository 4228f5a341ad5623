"""The job's own NetworkPolicies on real pods (marker ``real_pods``; issues 40 and 49).

The testbed's enforcer (kube-router's policy controller, ``testbeds/k8s/netpol.py``) is proven
on its own in ``test_network_policy_testbed.py``. Here: a tenant's job runs through the
namespace's default deny because of its policies, and a pod outside the job cannot reach a
worker's agent while the job runs; in a namespace without policies the default
(``--network-policy job``) keeps outsiders away from the agents just the same, while the job's
ranks still reach what lies outside the job (a listener on the node's address, a Service in
another namespace), which ``--network-policy strict`` cuts off.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest

from support.helpers import wait_started
from support.listener import LISTENER, LISTENER_PORT
from support.real_pods import finish, pods_of, ranks_from, stop
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
        # the namespace denies egress: the job added its own traffic to it (issue 49: only there)
        made = tenant.kubectl("get", "networkpolicies", "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
        out, err = finish(proc, 180)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, "".join(up)[-1000:] + out[-2000:] + err[-3000:]
    assert verdicts and all(v.split()[0] in ("refused", "timeout") for v in verdicts), verdicts
    assert sorted(made) == [f"networkpolicy.networking.k8s.io/{job}{s}" for s in ("", "-api", "-egress")], made
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


# Issue 49: the default policy must not take away the egress a namespace allows.
# each rank: every target (host:port) tried until it answers "ok" or 10 s passed, then the verdicts
# as one JSON line; then the job holds its agents up for the outsider's probes
RANK_PROGRAM = """
import json, socket, sys, time
from mpi4py import MPI
c = MPI.COMM_WORLD
out = {"rank": c.rank}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2) as s:
                out[target] = "ok" if s.recv(2) == b"ok" else "no answer"
        except OSError as e:
            out[target] = type(e).__name__
        if out[target] == "ok" or time.monotonic() - t0 > 10:
            break
        time.sleep(0.3)
print(json.dumps(out), flush=True)
c.barrier()
print("ranks up", flush=True)
time.sleep(12)
c.barrier()
"""


class NodeListener:
    """A TCP listener on the real node's address (this machine: the pods' bridge gateway), outside
    every pod, on a port outside the NodePort range (kube-router lets any pod reach a node port)."""

    def __init__(self, address: str):
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        while 30000 <= self.sock.getsockname()[1] <= 32767:
            self.sock.close()
            self.sock = socket.socket()
            self.sock.bind((address, 0))
        self.sock.listen(64)
        self.address = f"{address}:{self.sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"ok")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def outside(real):
    """What lies outside the job: a listener on the node's address, and a headless Service in a
    namespace of its own (no policy anywhere) in front of a listener pod. The testbed runs no
    service proxy, so the Service is headless: its name resolves (CoreDNS) to the pod's IP."""
    from testbeds.k8s.node_config import REAL_KEY

    node = real.cluster.get_json("nodes", "-l", f"{REAL_KEY}=true")["items"][0]
    node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    listener = NodeListener(node_ip)
    ns = f"oe-svc-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "listener", "namespace": ns, "labels": {"app": "listener"}},
        "spec": {
            "nodeSelector": {REAL_KEY: "true"},
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": REAL_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": real.image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", LISTENER],
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "listener", "namespace": ns},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "listener"},
            "ports": [{"protocol": "TCP", "port": LISTENER_PORT}],
        },
    }
    real.cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    deadline = time.monotonic() + 30  # a pod needs the namespace's default ServiceAccount
    while real.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {ns}"
        time.sleep(0.2)
    real.cluster.apply([pod, service])
    try:
        real.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/listener", "--timeout=120s")
        yield {"node": listener, "service": f"listener.{ns}.svc.cluster.local:{LISTENER_PORT}"}
    finally:
        listener.close()
        real.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("mode", ["job", "job-mesh", "strict"])
def test_network_policy_open_egress_default_keeps_the_namespaces_egress_and_outsiders_out(
    real, outsider, outside, mode
):
    """In a namespace without policies, every rank of a job with the default --network-policy
    reaches a listener on the node's address and a Service in another namespace (as with
    --network-policy none); --network-policy strict cuts both off (the control: what the default
    did before issue 49, 0 of the ranks). Under either, an outsider's pod cannot reach a worker's
    agent while the job runs, and the job itself succeeds. job-mesh: the same with
    --mesh-injection (issue 49 item 8: a kept mesh's proxies dial their control plane, a Service
    outside the job, which the default policy cut off)."""
    job = f"np-oe-{mode}"
    node, service = outside["node"].address, outside["service"]
    args = {"job": [], "job-mesh": ["--mesh-injection"], "strict": ["--network-policy", "strict"]}[mode]
    proc = real.start(job, *args, *PLACEMENT, "--", "python3", "-c", RANK_PROGRAM, node, service)
    try:
        up = wait_started(proc, 4, "ranks up")  # every rank ran its probes; the agents listen
        made = real.kubectl("get", "networkpolicies", "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
        worker = next(p for n, p in pods_of(real, job).items() if n.endswith("-worker-0"))
        verdicts = [probe(real, outsider, worker["status"]["podIP"], AGENT_PORT) for _ in range(3)]
        out, err = finish(proc, 180)
    finally:
        if proc.poll() is None:
            stop(proc)
    assert proc.returncode == 0, "".join(up)[-1000:] + out[-2000:] + err[-3000:]
    ranks = ranks_from("".join(up) + out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], ranks
    reached = {target: sum(r[target] == "ok" for r in ranks) for target in (node, service)}
    policies = sorted(m.split("/", 1)[1] for m in made)
    if mode != "strict":
        assert reached == {node: 4, service: 4}, ranks
        assert policies == [job], made  # ingress only: the namespace isolates no pod for egress
    else:
        assert reached == {node: 0, service: 0}, ranks
        assert policies == [job, f"{job}-api", f"{job}-egress"], made
    assert verdicts and all(v.split()[0] in ("refused", "timeout") for v in verdicts), verdicts
    print(f"open_egress {mode}: reached {reached} of 4 ranks each; outsider -> agent: {verdicts}")
    assert real.leftovers(job) == []
