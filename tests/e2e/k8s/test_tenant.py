"""A tenant of a locked-down shared cluster runs jobs (marker ``real_pods``; issue 40).

Every test here runs mpilaunch as a user bound only to the built-in ``edit``
role, in a namespace that enforces PodSecurity ``restricted``, with
default-deny NetworkPolicies, a ResourceQuota on limits and a LimitRange
(``tests/support/tenant.py``), on the testbed's real node: real containers,
real admission, real RBAC, and the testbed's NetworkPolicy enforcer.
The admin's only step is ``mpilaunch rbac --namespace NS | kubectl apply -f -``.
"""

from __future__ import annotations

import json

import pytest

from support.helpers import wait_for
from support.real_pods import assert_placement, ranks_from
from support.tenant import PLACEMENT, run_watching, tenant_pods

pytestmark = pytest.mark.real_pods

PROGRAMS = "/opt/mpilaunch/tests/programs"  # where the project image has them
# The project image's MPIs: how a job selects each and the Python whose mpi4py matches it
IMAGE_MPIS = {
    "openmpi4": ([], "python3", "Open MPI v4.1"),
    "openmpi5": (["--mpirun", "/opt/openmpi5/bin/mpirun"], "/opt/openmpi5/bin/python", "Open MPI v5"),
    "mpich": (["--mpi", "mpich"], "/opt/mpich/bin/python", "MPICH Version:"),
}


def assert_restricted(pod: dict) -> None:
    """What PodSecurity 'restricted' admitted: said explicitly on the pod and each container."""
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"] + spec.get("initContainers", []):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["limits"]["cpu"] and c["resources"]["limits"]["memory"], c["resources"]


def assert_no_identities_made(tenant, job: str) -> None:
    made = tenant.kubectl("get", "roles,rolebindings,serviceaccounts", "-o", "name").stdout.split()
    assert not [m for m in made if job in m], made


@pytest.mark.parametrize("launcher", ["cluster", "local", "local-agent"])
def test_tenant_runs_allreduce_with_placement_on_both_launchers(tenant, tmp_path, launcher):
    """The default path for an 'edit'-only user: the admin's ServiceAccount, every pod restricted,
    the job's own NetworkPolicy through the default-deny; nothing left, no RBAC object made.
    With --launcher local this machine is let in for the launch's traffic only (issue 49 item 9):
    mpirun's daemons connect back to it (TCP out of the pods), and with --transport agent its
    shims connect to the agents' port."""
    job = f"tn-{launcher}"
    extra = ["--launcher", "local", "--mpirun", "/usr/bin/mpirun.openmpi"] if launcher != "cluster" else []
    extra += ["--transport", "agent"] if launcher == "local-agent" else []
    code, out, err, seen = run_watching(
        tenant, job, *extra, *PLACEMENT, "--output-dir", str(tmp_path), "--", "python3", f"{PROGRAMS}/placement.py"
    )
    assert code == 0, out[-2000:] + err[-3000:]
    assert_placement(None, job, ranks_from(out), 4, 2, seen)
    for pod in seen.values():
        assert_restricted(pod)
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    if launcher == "cluster":
        launcher_pod = next(p for n, p in seen.items() if "-launcher" in n)
        assert launcher_pod["spec"]["serviceAccountName"] == "mpilaunch"
    assert_no_identities_made(tenant, job)
    assert tenant.leftovers(job) == []


def test_tenant_runs_a_foreign_image(tenant, foreign, tmp_path):
    """A stock Debian Open MPI image that no one here prepared for a restricted namespace (its user
    is root): mpilaunch's non-root UID and writable /tmp make it run."""
    job = "tn-foreign"
    image = foreign("openmpi")
    program = (
        "from mpi4py import MPI; c = MPI.COMM_WORLD; import os, json; "
        "print(json.dumps({'rank': c.rank, 'sum': c.allreduce(c.rank + 1), 'uid': os.getuid()}))"
    )
    code, out, err, seen = run_watching(tenant, job, *PLACEMENT, "--", "python3", "-c", program, image=image)
    assert code == 0, out[-2000:] + err[-3000:]
    ranks = ranks_from(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["sum"] for r in ranks} == {10}, ranks
    assert {r["uid"] for r in ranks} == {1000}
    assert all(p["spec"]["containers"][0]["image"] == image for p in seen.values())
    assert tenant.leftovers(job) == []


@pytest.mark.parametrize("flavour", list(IMAGE_MPIS))
def test_tenant_read_only_root_and_an_openshift_uid(tenant, tmp_path, flavour):
    """OpenShift's restricted-v2: a UID from the namespace's range, GID 0, no passwd entry; and a
    read-only root file system. Every MPI of the image runs: its session directory, HOME and the
    run directory are on the pod's /tmp."""
    job = f"tn-ro-{flavour}"
    mpi_args, python, library = IMAGE_MPIS[flavour]
    # a 3.2 MB allreduce too: past every eager limit, the ranks of a pod take their single-copy path,
    # which the RuntimeDefault seccomp profile refuses for MPICH (security.SECCOMP_MPI_SETTINGS)
    program = (
        "import os, json, pwd\nfrom array import array\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "try:\n    pwd.getpwuid(os.getuid()); named = True\nexcept KeyError:\n    named = False\n"
        "big = array('d', [c.rank + 1.0]) * 400000; out = array('d', [0.0]) * 400000\n"
        "c.Allreduce(big, out)\n"
        "print(json.dumps({'rank': c.rank, 'sum': c.allreduce(c.rank + 1), 'uid': os.getuid(), "
        "'big': [out[0], out[-1]], 'gid': os.getgid(), 'named': named, "
        "'library': MPI.Get_library_version()}))"
    )
    code, out, err, seen = run_watching(
        tenant,
        job,
        *mpi_args,
        "--read-only-root",
        "--run-as-user",
        "1000650000:0",
        *PLACEMENT,
        "--",
        python,
        "-c",
        program,
    )
    assert code == 0, out[-2000:] + err[-3000:]
    ranks = ranks_from(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["sum"] for r in ranks} == {10}, ranks
    assert {(r["uid"], r["gid"], r["named"]) for r in ranks} == {(1000650000, 0, False)}
    assert all(r["big"] == [10.0, 10.0] for r in ranks), ranks
    assert all(r["library"].startswith(library) for r in ranks), ranks[0]["library"]
    for pod in seen.values():
        assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in pod["spec"]["containers"])
    assert tenant.leftovers(job) == []


def detached_job_completes(tenant, job: str, *args: str) -> dict:
    """Submit a detached job; `mpilaunch wait` gives its exit status 0, its launcher Job completes
    and the reaper releases the workers. The launcher Job as it completed ({} once gone)."""
    submitted = tenant.run(job, "--detach", *args, *PLACEMENT, "--", "python3", f"{PROGRAMS}/placement.py")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    waited = tenant.manage("wait", job, "--timeout", "240")
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr[-2000:]

    def launcher_job() -> dict:
        return json.loads(tenant.kubectl("get", "job", f"{job}-launcher", "-o", "json", check=False).stdout or "{}")

    # the Job controller counts the pod's success a moment after the pod ends (or the job is gone)
    wait_for(
        lambda: not launcher_job() or launcher_job()["status"].get("succeeded") == 1, 60, "the launcher Job to complete"
    )
    launcher = launcher_job()
    wait_for(
        lambda: not tenant_pods(tenant, job) or all("-launcher" in n for n in tenant_pods(tenant, job)),
        120,
        "the workers released",
    )
    return launcher


def test_tenant_detached_job_completes_and_is_reaped(tenant, tmp_path):
    """--detach with the admin's ServiceAccount: the launcher Job completes (no mesh sidecar: the
    pods opt out), `mpilaunch wait` gives its exit status, the reaper releases the workers."""
    job = "tn-detach"
    launcher = detached_job_completes(tenant, job)
    if launcher:
        annotations = launcher["spec"]["template"]["metadata"]["annotations"]
        assert annotations["sidecar.istio.io/inject"] == "false" and annotations["linkerd.io/inject"] == "disabled"
    assert_no_identities_made(tenant, job)
    tenant.manage("delete", job)
    assert tenant.leftovers(job) == []


# Istio's pilot-agent as far as a Job's pod sees it: a proxy container beside the main one that runs
# until POST 127.0.0.1:15020/quitquitquit. A stand-in, in the project image: no mesh's images can be
# fetched here. It exits 0 on that request and never otherwise, so the pod, and the Job, complete
# only if mpilaunch asks.
STAND_IN_PROXY = """\
import http.server, os
class Quit(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200 if self.path == "/quitquitquit" else 404)
        self.end_headers()
        self.wfile.flush()
        if self.path == "/quitquitquit":
            os._exit(0)
http.server.HTTPServer(("127.0.0.1", 15020), Quit).serve_forever()
"""


def test_tenant_mesh_injection_detached_job_with_a_sidecar_completes_and_is_reaped(tenant, tmp_path):
    """--mesh-injection (a mandatory mesh) with --detach: the launcher Job's pod carries a mesh
    proxy that outlives its main container; the launcher asks it to quit at the end, so the Job
    completes, `mpilaunch wait` gives the exit status and the workers are released."""
    import yaml

    template = tmp_path / "mesh.yaml"
    proxy = {
        "name": "istio-proxy",
        "image": tenant.real.image,
        "command": ["python3", "-c", STAND_IN_PROXY],
        "resources": {"limits": {"cpu": "50m", "memory": "48Mi"}, "requests": {"cpu": "50m", "memory": "48Mi"}},
    }
    template.write_text(
        yaml.safe_dump(
            {
                "metadata": {"labels": {"mpilaunch/role": "launcher"}},
                "spec": {"containers": [{"name": "launcher"}, proxy]},
            }
        )
    )
    job = "tn-mesh"
    launcher = detached_job_completes(tenant, job, "--mesh-injection", "--pod-template", str(template))
    assert launcher.get("status", {}).get("succeeded") == 1, json.dumps(launcher.get("status"))
    annotations = launcher["spec"]["template"]["metadata"]["annotations"]
    assert "sidecar.istio.io/inject" not in annotations, annotations  # injection kept
    pods = json.loads(tenant.kubectl("get", "pods", "-l", f"job-name={job}-launcher", "-o", "json").stdout)["items"]
    ended = {
        c["name"]: c["state"].get("terminated", {}).get("exitCode")
        for p in pods
        for c in p["status"]["containerStatuses"]
    }
    assert ended.get("istio-proxy") == 0 and ended.get("launcher") == 0, ended
    tenant.manage("delete", job)
    assert tenant.leftovers(job) == []


def test_tenant_without_service_account_is_told_what_the_admin_applies(tenant):
    """An 'edit'-only user may not create Roles: one line naming what is missing and the
    `mpilaunch rbac` command, exit 2, before anything is created."""
    job = "tn-norbac"
    result = tenant.run(job, *PLACEMENT, "--", "true", account=False, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "may not create roles, rolebindings in namespace" in result.stderr, (
        result.stderr
    )  # edit may make ServiceAccounts
    assert f"mpilaunch rbac --namespace {tenant.namespace} | kubectl apply -f -" in result.stderr
    assert "--service-account mpilaunch" in result.stderr
    assert "Traceback" not in result.stderr
    assert tenant.objects_of(job) == []


def test_tenant_quota_refusal_names_the_quota(tenant):
    """A worker larger than the namespace's quota: the ResourceQuota is named with what was asked,
    not 'your credentials lack a permission'; exit 3 and nothing left."""
    job = "tn-quota"
    result = tenant.run(job, "--pod-cpu", "6", "--pod-memory", "1Gi", *PLACEMENT, "--", "true", timeout=120)
    assert result.returncode == 3, result.stderr
    assert "ResourceQuota 'compute' is exceeded" in result.stderr and "limits.cpu" in result.stderr, result.stderr
    assert "lack a permission" not in result.stderr
    assert tenant.leftovers(job) == []


def test_tenant_root_is_refused_by_pod_security_naming_what_to_pass(tenant):
    """--run-as-user root in a restricted namespace: admission is asked first (a dry run of the
    job's pods), so the line names PodSecurity and the hint --run-as-user, exit 2, and nothing was
    created at all."""
    job = "tn-root"
    result = tenant.run(job, "--run-as-user", "root", *PLACEMENT, "--", "true", timeout=120)
    assert result.returncode == 2, result.stderr
    assert "PodSecurity level restricted:latest refuses it" in result.stderr, result.stderr
    assert "--run-as-user" in result.stderr and "nothing was created" in result.stderr
    assert tenant.objects_of(job) == []


@pytest.mark.ps
def test_tenant_ps_mode_trains_across_pods(tenant, tf_image, tmp_path):
    """PS mode as the tenant: chief, worker and ps pods with TF_CONFIG reach each other and the
    registry on this machine through the job's NetworkPolicy; sized under the LimitRange and quota.
    Each task in its own pod (no launcher Job): the chief's ClusterCoordinator runs real training
    steps on the worker pod with the variables on the ps pod, over the pods' IPs. (It was also a
    separate cluster-admin test, test_real_pods.py's; this one covers it, in half the time.)"""
    job = "tn-ps"
    code, out, err, seen = run_watching(
        tenant,
        job,
        "--mode",
        "ps",
        "--chief",
        "--workers",
        "1",
        "--ps",
        "1",
        "--timeout",
        "400",
        "--pod-cpu",
        "400m",
        "--pod-memory",
        "1Gi",
        "--output-dir",
        str(tmp_path),
        "-q",
        "--",
        "python3",
        "/opt/mpilaunch/examples/ps_keras.py",
        "--steps",
        "12",
        image=tf_image,
        timeout=480,
    )
    assert code == 0, out[-3000:] + err[-3000:]
    assert sorted(seen) == sorted(f"{job}-{t}" for t in ("chief-0", "worker-0", "ps-0"))
    summary = json.loads(next(line.split("PS-KERAS ", 1)[1] for line in out.splitlines() if "PS-KERAS {" in line))
    report = json.loads((tmp_path / "report.json").read_text())
    assert summary["cluster"] == report["cluster"]
    # every task's address is its own pod's IP: the steps really crossed pods
    for kind, addresses in report["cluster"].items():
        for index, address in enumerate(addresses):
            assert address.rsplit(":", 1)[0] == seen[f"{job}-{kind}-{index}"]["status"]["podIP"], (kind, address)
    assert len({pod["status"]["podIP"] for pod in seen.values()}) == 3
    assert summary["steps"] == 12 and summary["loss_after"] < summary["loss_before"], summary
    assert summary["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    status = {t["task"]: t["status"] for t in report["tasks"]}
    assert status["chief:0"] == "succeeded"
    assert {status["worker:0"], status["ps:0"]} == {"terminated"}
    for task in ("worker:0", "ps:0"):
        assert f"[{task}] {task} serving at grpc://{report['cluster'][task.split(':')[0]][int(task[-1])]}" in out
    for pod in seen.values():
        assert_restricted(pod)
    assert_no_identities_made(tenant, job)
    assert tenant.leftovers(job) == []
