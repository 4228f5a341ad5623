"""Who the job's in-cluster pieces act as (backends/k8s/rbac.py, k8s-rbac.yaml.j2, k8s-reaper.yaml.j2):
each Role grants exactly the verbs its pieces' calls use, and no more (issue 49, item 5).

``USES`` is the list of every call the launcher pod and the reaper pod make to the API server
(found by reading launcher.py, reaper.py, orphan.reap, detached.py, hang_event.py, pod_events.py
and transport.py; the submitting mpilaunch acts with the user's own credentials, not these).
The admin's namespace-wide Role (``mpilaunch rbac``) is their union; each per-job Role is its own
piece's share, by name wherever a name is known."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jinja2")

from mpilaunch.backends.k8s import rbac

# piece -> {(apiGroup, resource, verb): the call that needs it}
USES = {
    "launcher": {
        ("", "pods", "get"): "launcher.wait_workers, ReadyPods.lost_workers: each worker pod by name",
        ("", "pods", "watch"): "pod_events.FirstPendingWatch: one pod, by fieldSelector metadata.name",
    },
    "launcher --transport exec": {
        ("", "pods/exec", "create"): "transport.py: the websocket upgrade (newer API servers' verb)",
        ("", "pods/exec", "get"): "transport.py: the websocket upgrade, a GET (older API servers' verb)",
    },
    "launcher --detach": {
        ("", "configmaps", "get"): "detached.record_outcome: the root's resourceVersion",
        ("", "configmaps", "patch"): "detached.record_outcome: result.json into the root",
        ("", "pods", "delete"): "launcher.finish_detached: the workers",
        ("", "secrets", "delete"): "detached.delete_secrets: <job>-env, <job>-agent",
        ("", "events", "create"): "hang_event.post_on_own_pod: the Hang verdict",
    },
    "reaper": {
        ("coordination.k8s.io", "leases", "get"): "orphan.reap: the Lease's renewTime",
        ("", "configmaps", "delete"): "orphan.delete_root: the orphaned job's root",
    },
    "reaper --detach": {
        ("", "configmaps", "get"): "detached.reap_detached: the root (gone? recorded?)",
        ("", "configmaps", "patch"): "detached.record_outcome",
        ("batch", "jobs", "get"): "detached.reap_detached: the launcher Job's conditions",
        ("batch", "jobs", "delete"): "detached.release: a launcher Job whose pod is stuck",
        ("", "pods", "delete"): "detached.release: the workers",
        ("", "secrets", "delete"): "detached.delete_secrets",
    },
}


def flat(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def uses(*pieces: str) -> set[tuple[str, str, str]]:
    return set().union(*(USES[p].keys() for p in pieces))


def test_rbac_role_lists_exactly_the_verbs_each_piece_uses():
    """The admin's Role: the union of every piece's calls; nothing lists pods, watches a Lease or
    patches an Event (what the Role granted before, and nothing called)."""
    role = next(o for o in rbac.objects("team-a") if o["kind"] == "Role")
    assert flat(role["rules"]) == uses(*USES)
    assert ("", "pods", "list") not in flat(role["rules"])


def per_job_roles(tmp_path, *args: str) -> dict[str, list[dict]]:
    from support.k8s_render import rendered_backend

    backend = rendered_backend(tmp_path, *args, name="rj", command=("true",))
    return {o["metadata"]["name"]: o["rules"] for _, o in backend.objects() if o["kind"] == "Role"}


@pytest.mark.parametrize(
    "args,launcher,reaper",
    [
        ([], ["launcher"], ["reaper"]),
        (["--transport", "exec"], ["launcher", "launcher --transport exec"], ["reaper"]),
        (["--detach"], ["launcher", "launcher --detach"], ["reaper --detach"]),
        (
            ["--detach", "--transport", "exec"],
            ["launcher", "launcher --transport exec", "launcher --detach"],
            ["reaper --detach"],
        ),
    ],
    ids=["attached", "attached-exec", "detached", "detached-exec"],
)
def test_rbac_per_job_roles_list_exactly_the_verbs_of_their_piece_by_name(tmp_path, args, launcher, reaper):
    roles = per_job_roles(tmp_path, *args)
    assert flat(roles["rj-launcher"]) == uses(*launcher)
    assert flat(roles["rj-reaper"]) == uses(*reaper)
    workers = ["rj-worker-0", "rj-worker-1"]
    secrets = ["rj-env"] + (["rj-agent"] if "exec" not in args else [])
    for rule in roles["rj-launcher"] + roles["rj-reaper"]:
        names = rule.get("resourceNames")
        if rule["resources"] == ["events"]:  # a create cannot be limited to names
            assert names is None and rule["verbs"] == ["create"]
        elif rule["resources"] == ["secrets"]:
            assert names == secrets
        elif rule["resources"][0].startswith("pods"):
            assert names == workers
        else:
            assert names and all(n in ("rj", "rj-launcher") for n in names), rule
