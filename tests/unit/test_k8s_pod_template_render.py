"""--pod-template and --gpu-resource through `mpilaunch render`: the pods created are the merged ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.helpers import REPO

yaml = pytest.importorskip("yaml")


def render(*args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "render",
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            "j",
            "--launcher",
            "cluster",
            *args,
            "--",
            "python3",
            "train.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pod_template_render_merges_into_workers_and_launcher(tmp_path):
    path = tmp_path / "tpl.yaml"
    path.write_text(
        "kind: Pod\nspec:\n  imagePullSecrets: [{name: regcred}]\n---\n"
        "kind: Pod\nmetadata: {labels: {mpilaunch/role: launcher}}\nspec:\n"
        "  serviceAccountName: ml-runner\n  nodeSelector: {pool: cpu}\n"
    )
    proc = render("--gpus", "16", "--gpus-per-node", "8", "--gpu-resource", "amd.com/gpu", "--pod-template", str(path))
    assert proc.returncode == 0, proc.stderr
    objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
    workers = [o for o in objs if o["kind"] == "Pod"]
    (launcher,) = [o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "j-launcher"]
    assert [w["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] for w in workers] == [8, 8]
    assert all(w["spec"]["imagePullSecrets"] == [{"name": "regcred"}] for w in workers)
    pod = launcher["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["imagePullSecrets"] == [{"name": "regcred"}]
    # the launcher template's account is taken as --service-account: no per-job Role or RoleBinding
    assert pod["serviceAccountName"] == "ml-runner"
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding")]


def test_pod_template_all_roles_service_account_is_not_the_launchers_nor_the_reapers(tmp_path):
    """Issue 49, item 10: a serviceAccountName in the document for every role (a bucket reader for
    the workers) became the launcher's and the reaper's identity: no per-job Roles, a reaper
    without rights. It is the workers' only; the launcher and reaper keep their own, and one
    warning line says so."""
    path = tmp_path / "tpl.yaml"
    path.write_text("kind: Pod\nspec:\n  serviceAccountName: s3-reader\n  imagePullSecrets: [{name: regcred}]\n")
    proc = render("--np", "2", "--pod-template", str(path))
    assert proc.returncode == 0, proc.stderr
    objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
    accounts = {
        o["metadata"]["name"]: (o["spec"].get("template") or o)["spec"].get("serviceAccountName")
        for o in objs
        if o["kind"] in ("Pod", "Job")
    }
    assert accounts == {"j-reaper": "j-reaper", "j-worker-0": "s3-reader", "j-launcher": "j-launcher"}, accounts
    roles = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "Role")
    assert roles == ["j-launcher", "j-reaper"]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"mpilaunch: warning: --pod-template {path}: serviceAccountName 's3-reader' in the document for every "
        "role is the workers' only; the launcher and reaper keep their per-job identities (to give them one, "
        "label a document mpilaunch/role: launcher, or pass --service-account)"
    ], proc.stderr
    # with --service-account, they run as that account, and the line says so
    proc = render("--np", "2", "--pod-template", str(path), "--service-account", "mpilaunch")
    assert proc.returncode == 0, proc.stderr
    objs = [o for o in yaml.safe_load_all(proc.stdout) if o]
    (launcher,) = [o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "j-launcher"]
    assert launcher["spec"]["template"]["spec"]["serviceAccountName"] == "mpilaunch"
    assert "the launcher and reaper run as 'mpilaunch'" in proc.stderr, proc.stderr


def test_pod_template_render_refuses_an_owned_field_with_exit_2(tmp_path):
    path = tmp_path / "tpl.yaml"
    path.write_text("kind: Pod\nspec:\n  containers: [{name: worker, ports: [{containerPort: 7355}]}]\n")
    proc = render("--np", "2", "--transport", "agent", "--pod-template", str(path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        f"mpilaunch: error: --pod-template {path}: the worker container's port 7355 "
        f"in the worker pod is mpilaunch's\n  hint: "
    )
    assert "Traceback" not in proc.stderr
