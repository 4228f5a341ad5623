"""Where a Kubernetes job's mpirun runs is chosen once (``backends/k8s/launcher_placement.py``).

The backend and its helpers ask the strategy object; none compares ``launcher`` with
"cluster" or "local" itself (20 such branch sites across six modules before it). What each
placement makes and does is checked on the objects a render produces, no cluster needed."""

from __future__ import annotations

import ast

import pytest

from support.helpers import REPO
from support.k8s_render import rendered_backend

K8S = REPO / "mpilaunch" / "backends" / "k8s"


def launcher_branches(root, base=REPO) -> list[str]:
    """Every comparison of a ``.launcher`` attribute with "cluster" or "local" under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if any(isinstance(n, ast.Attribute) and n.attr == "launcher" for n in sides) and any(
                isinstance(n, ast.Constant) and n.value in ("cluster", "local") for n in sides
            ):
                found.append(f"{path.relative_to(base)}:{node.lineno}")
    return found


def test_no_kubernetes_module_branches_on_the_launcher_but_the_placement():
    assert launcher_branches(K8S) == []


def test_the_branch_check_sees_one(tmp_path):
    (tmp_path / "helper.py").write_text('def f(backend):\n    return backend.launcher == "cluster"\n')
    (tmp_path / "fine.py").write_text('def g(backend):\n    return backend.launcher_name == "cluster"\n')
    assert launcher_branches(tmp_path, tmp_path) == ["helper.py:2"]


def backend_for(tmp_path, *args):
    return rendered_backend(tmp_path, *args)


def kinds(backend) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for _, o in backend.objects()]


@pytest.mark.parametrize("args", [[], ["--launcher", "cluster"]], ids=["default", "cluster"])
def test_the_launcher_pod_placement_makes_its_job_role_and_secret_and_uses_the_agents(tmp_path, args):
    backend = backend_for(tmp_path, *args)
    made = kinds(backend)
    assert type(backend.launcher_placement).__name__ == "PodLauncher"
    assert ("Job", "j-launcher") in made and ("Role", "j-launcher") in made and ("Secret", "j-env") in made
    assert backend.transport == "agent"  # the launcher pod is on the pod network
    root = next(o for _, o in backend.objects() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "j")
    assert '"command"' in root["data"]["launch.json"]  # the launcher pod is told the launch
    assert backend.control_address() is None  # the ranks call the launcher pod, not this machine


def test_the_submitter_placement_makes_no_launcher_objects_and_uses_the_exec_api(tmp_path):
    backend = backend_for(tmp_path, "--launcher", "local")
    made = kinds(backend)
    assert type(backend.launcher_placement).__name__ == "SubmitterLauncher"
    assert not [k for k in made if k[1] == "j-launcher" or k == ("Secret", "j-env")]
    assert backend.transport == "exec"
    root = next(o for _, o in backend.objects() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "j")
    assert not root["data"].get("launch.json")  # no launcher pod to tell
    # the hang verdict goes on worker 0's pod: there is no launcher pod
    assert backend.cluster_notes is not None and backend._hang_pod() == "j-worker-0"


def test_a_chosen_transport_holds_under_either_placement(tmp_path):
    assert backend_for(tmp_path, "--launcher", "local", "--transport", "agent").transport == "agent"
    assert backend_for(tmp_path, "--transport", "exec").transport == "exec"


def test_spare_pods_are_named_in_a_role_only_where_a_launcher_pod_has_one(tmp_path):
    cluster = backend_for(tmp_path, "--spares", "1", "--retries", "1")
    role = next(o for _, o in cluster.objects() if o["kind"] == "Role" and o["metadata"]["name"] == "j-launcher")
    named = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert {"j-spare-0", "j-spare-1"} <= named
    local = backend_for(tmp_path, "--launcher", "local", "--spares", "1", "--retries", "1")
    assert local.launcher_placement.spare_names_for_role(local) == []
