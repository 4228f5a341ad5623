"""The two one-off checks of bench_vs_mpi_operator.py: Open MPI 5, and an ``edit``-only tenant.

Open MPI 5 (``foreign-mpiop5``, Debian trixie's 5.0): the MPIJob and ``mpilaunch
--launcher cluster`` (``--launcher local`` would pair this machine's Open MPI 4.1
mpirun with the image's 5.0 daemons, which cannot work), interleaved; the table
says where each rank ran (``placed``: in the worker pod the plan says) and on
which hosts (mpi-operator issue #842: the operator sets Open MPI 4's
``OMPI_MCA_orte_default_hostfile``, which 5.0's PRRTE does not read).

Tenant: tests/support/tenant.py's namespace (PodSecurity ``restricted``, deny-all
NetworkPolicies, a quota, a LimitRange) and its user, bound to ``edit`` there
only, with the admin's one-time ``mpilaunch rbac``. Tried in order, each
bounded, each outcome recorded as it is:

1. the MPIJob as the operator's examples write it, as the tenant;
2. the same after the admin binds the operator's own ``kubeflow-mpijobs-edit``
   ClusterRole to the tenant in the namespace (the CRD is the admin's already);
3. the MPIJob with every container made ``restricted``-compliant (non-root,
   no privilege escalation, every capability dropped, RuntimeDefault seccomp)
   and a NetworkPolicy, the tenant's own, letting the job's pods reach each
   other and DNS;
4. mpilaunch as the tenant (``--service-account mpilaunch``), nothing added.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

RESTRICTED = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "container": {
        "securityContext": {
            "runAsUser": 1000,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    },
}


def ompi5(cluster, op_pid, image, rounds, table, rate, operator_run, repeat: int = 3) -> dict:
    systems = ["mpi-operator", "mpilaunch cluster"]
    rows = rounds(cluster, op_pid, image, 2, 2, repeat, 2.0, "o5-", systems)
    table(rows, rate, f"Open MPI 5 (Debian trixie), 4 ranks on 2 pods, {repeat} runs each")
    print("Hosts the ranks ran on, every run:")
    print()
    for i, r in enumerate(rows):
        print(f"- run {i}: " + "; ".join(f"{s}: {', '.join(v.get('hosts', [])) or '-'}" for s, v in r.items()))
    # the MPIJob as written fails for want of slots where the launcher pod's node has fewer cores
    # than ranks: mpirun counts only its own host. Oversubscribed, where do the ranks run?
    over = operator_run(cluster, op_pid, image, "mo-o5-over", 2, 2, mpirun_args=("--map-by", ":OVERSUBSCRIBE"))
    print(
        f"- the MPIJob with `mpirun --map-by :OVERSUBSCRIBE`: {'ran' if over['ok'] else 'failed'}, ranks on "
        f"{', '.join(over.get('hosts', [])) or '-'} (placed as planned: {over.get('placed')})"
    )
    print()
    for r in rows:
        for system, v in r.items():
            if v.get("error"):
                print(f"- {system} error: {v['error'][:600]}")
                break
    print()
    return {"rows": rows, "oversubscribed": over}


def job_policy(job: str, namespace: str) -> dict:
    """What the tenant adds for an MPIJob under default-deny: its pods reach each other and DNS."""
    pods = {"matchLabels": {"training.kubeflow.org/job-name": job}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{job}-peers", "namespace": namespace},
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": pods}]}],
            "egress": [
                {"to": [{"podSelector": pods}]},
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            ],
        },
    }


def tenant(cluster, op_pid, image, operator_run, mpilaunch_run) -> list[dict]:
    import json

    from support.real_pods import Real
    from support.tenant import ACCOUNT, Tenant

    t = Tenant(Real(cluster, image), Path(tempfile.mkdtemp(prefix="bench-mo-tenant-"))).setup()
    ns, out = t.namespace, []
    try:

        def note(step: str, r: dict) -> None:
            r = {"step": step, **r}
            out.append(r)
            ok = "ran" if r.get("ok") else "did not run"
            print(
                f"- {step}: {ok}; "
                + (r.get("error") or f"first rank line {r.get('first', 0):.2f} s, placed {r.get('placed')}")
            )

        print(f"### The same job as an `edit`-only tenant (namespace {ns}: PodSecurity restricted, deny-all)")
        print()
        run = dict(ns=ns, kubeconfig=t.kubeconfig, timeout=60)
        note("MPIJob as the examples write it, `edit` only", operator_run(cluster, op_pid, image, "mo-t1", 2, 2, **run))
        t.kubectl("create", "rolebinding", "tenant-mpijobs", "--clusterrole=kubeflow-mpijobs-edit", f"--user={t.user}")
        note(
            "the same, the admin bound kubeflow-mpijobs-edit",
            operator_run(cluster, op_pid, image, "mo-t2", 2, 2, **run),
        )
        applied = subprocess.run(
            [cluster.kubectl_bin, f"--kubeconfig={t.kubeconfig}", "-n", ns, "apply", "-f", "-"],
            input=json.dumps(job_policy("mo-t3", ns)),
            capture_output=True,
            text=True,
        )
        note(
            "restricted-compliant pod templates + the tenant's NetworkPolicy"
            + ("" if applied.returncode == 0 else f" (policy refused: {applied.stderr.strip()})"),
            operator_run(cluster, op_pid, image, "mo-t3", 2, 2, extra=RESTRICTED, **run),
        )
        note(
            "mpilaunch --launcher cluster, as the tenant",
            mpilaunch_run(
                cluster,
                op_pid,
                image,
                "mo-t4",
                2,
                2,
                "cluster",
                ns=ns,
                env_extra={"KUBECONFIG": t.kubeconfig},
                args=("--service-account", ACCOUNT),
            ),
        )
        print()
    finally:
        t.teardown()
    return out
