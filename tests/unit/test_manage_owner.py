"""status|logs|wait|delete touch only mpilaunch's own jobs (pure: a fake API and a fake skein client).

The real testbeds check the same end to end (test_k8s.py, test_yarn.py:
``..._not_a_job``, ``..._did_not_submit``); these pin the cases a testbed
does not easily make: the uid precondition, a root gone with pods left,
another user's job beside one's own.
"""

from __future__ import annotations

import io
import types

import pytest

from mpilaunch.backends.k8s import manage as k8s_manage
from mpilaunch.backends.k8s.api import ApiError
from mpilaunch.backends.yarn import manage as yarn_manage
from mpilaunch.core.errors import UsageError
from mpilaunch.job import manage


class FakeApi:
    namespace = "default"

    def __init__(self, configmaps: dict, pods=()):
        self.configmaps, self.pods, self.deleted = configmaps, list(pods), []

    def get(self, api_version, plural, name=None, **query):
        if plural == "configmaps" and name:
            if name not in self.configmaps:
                raise ApiError(404, "NotFound", f"configmaps {name!r} not found")
            return self.configmaps[name]
        return {"items": self.pods if plural == "pods" else []}

    def delete(self, api_version, plural, name, namespace="", **body):
        self.deleted.append((plural, name, body.get("preconditions")))

    def delete_collection(self, api_version, plural, selector, **body):
        self.deleted.append((plural, selector, None))
        if plural == "pods":
            self.pods = []


def act(job, action: str, out) -> int:
    """What `mpilaunch ACTION NAME` does with the backend's job (job/manage.py's job_action)."""
    if action == "status":
        manage.print_status(job.status(), out)
    elif action == "logs":
        job.logs(out, False)
    elif action == "delete":
        job.delete(out)
    else:
        return manage.wait(job, 1, out, io.StringIO())
    return 0


def k8s(monkeypatch, action, api, name="job1"):
    monkeypatch.setattr(k8s_manage, "_manage_api", lambda args: api)
    out = io.StringIO()
    job = k8s_manage.K8sNamedJob(types.SimpleNamespace(name=name, timeout=1, follow=False))
    return act(job, action, out), out.getvalue()


def configmap(labels=None, uid="uid-1"):
    meta = {"name": "job1", "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"metadata": {**meta, **({"labels": labels} if labels is not None else {})}, "data": {}}


@pytest.mark.parametrize(
    "labels,says",
    [
        (None, "it has no mpilaunch/job label"),
        ({"app": "x"}, "it has no mpilaunch/job label"),
        ({"mpilaunch/job": "job2"}, "its mpilaunch/job label is 'job2'"),
    ],
)
@pytest.mark.parametrize("action", ["delete", "status", "logs", "wait"])
def test_k8s_a_configmap_without_the_job_label_is_no_job(monkeypatch, action, labels, says):
    api = FakeApi({"job1": configmap(labels)})
    with pytest.raises(UsageError) as e:
        k8s(monkeypatch, action, api)
    assert e.value.exit_code == 2 and e.value.hint
    assert e.value.message == f"configmap job1 in namespace default is not an mpilaunch job ({says})"
    assert api.deleted == []


def owned_pod(name: str, root_uid: str) -> dict:
    return {"metadata": {"name": name, "ownerReferences": [{"kind": "ConfigMap", "name": "job1", "uid": root_uid}]}}


def test_k8s_delete_removes_exactly_the_root_it_checked(monkeypatch):
    api = FakeApi(
        {"job1": configmap({"mpilaunch/job": "job1"}, uid="uid-7")}, pods=[owned_pod("job1-worker-0", "uid-7")]
    )
    assert k8s(monkeypatch, "delete", api) == (0, "deleted job job1 in namespace default\n")
    assert api.deleted[0] == ("configmaps", "job1", {"uid": "uid-7"})
    assert ("pods", "mpilaunch/job=job1", None) in api.deleted


def test_k8s_delete_with_the_root_gone_leaves_any_configmap_of_that_name_alone(monkeypatch):
    api = FakeApi({}, pods=[owned_pod("job1-worker-0", "uid-gone")])
    assert k8s(monkeypatch, "delete", api)[0] == 0
    assert [d for d in api.deleted if d[0] == "configmaps"] == []
    assert ("pods", "mpilaunch/job=job1", None) in api.deleted
    with pytest.raises(UsageError, match="no job job1 in namespace default"):
        k8s(monkeypatch, "delete", FakeApi({}))
    # a pod that only carries the label is no job's (issue 49)
    with pytest.raises(UsageError, match="no job job1 in namespace default"):
        k8s(monkeypatch, "delete", FakeApi({}, pods=[{"metadata": {"name": "job1-worker-0"}}]))


class FakeClient:
    def __init__(self, apps):
        self.apps, self.killed = apps, []

    def get_applications(self, **query):
        return list(self.apps)

    def kill_application(self, app_id, user=""):
        self.killed.append(app_id)

    def get_nodes(self, **query):
        return []

    def close(self):
        pass


def app(app_id, user, *tags, state="RUNNING"):
    return types.SimpleNamespace(
        id=app_id,
        name="job1",
        tags=set(tags),
        user=user,
        state=state,
        final_status="UNDEFINED",
        queue="default",
        diagnostics="",
        runtime=None,
        start_time=int(app_id[-1]),
    )


def yarn(monkeypatch, action, apps, user="alice"):
    client = FakeClient(apps)
    monkeypatch.setattr(yarn_manage, "skein_client", lambda: client)
    monkeypatch.setenv("HADOOP_USER_NAME", user)
    out = io.StringIO()
    try:
        job = yarn_manage.YarnNamedJob(types.SimpleNamespace(name="job1", follow=False))
        return act(job, action, out), out.getvalue(), client.killed
    except UsageError as e:
        assert client.killed == []
        return e, out.getvalue(), client.killed


@pytest.mark.parametrize("action", ["delete", "status", "logs"])
def test_yarn_an_application_without_the_mpilaunch_tag_is_no_job(monkeypatch, action):
    e, out, _ = yarn(monkeypatch, action, [app("app_1", "alice"), app("app_2", "alice", "other")])
    assert isinstance(e, UsageError) and e.exit_code == 2 and e.hint and out == ""
    assert e.message == "YARN application 'job1' (app_1, app_2) is not an mpilaunch job: it has no 'mpilaunch' tag"


def test_yarn_delete_kills_only_the_users_own_jobs(monkeypatch):
    bobs = app("app_1", "bob", "mpilaunch")
    e, _, _ = yarn(monkeypatch, "delete", [bobs])
    assert isinstance(e, UsageError) and e.exit_code == 2
    assert e.message == "YARN application 'job1' is not yours to delete (app_1 submitted by bob; you are alice)"
    code, out, killed = yarn(
        monkeypatch,
        "delete",
        [
            bobs,
            app("app_2", "alice"),
            app("app_3", "alice", "mpilaunch"),
            app("app_4", "alice", "mpilaunch", state="FINISHED"),
        ],
    )
    assert code == 0 and killed == ["app_3"]
    assert out == (
        "killed app_3 (job1)\napp_4 already FINISHED\n"
        "left app_1 (job1) RUNNING: submitted by bob\nleft app_2 (job1) RUNNING: not an mpilaunch job\n"
    )


def test_yarn_status_lists_the_jobs_and_names_what_it_left_out(monkeypatch):
    code, out, _ = yarn(monkeypatch, "status", [app("app_1", "bob"), app("app_2", "bob", "mpilaunch")])
    assert code == 0 and out.startswith("app_2  job1  Running"), out
    assert out.endswith("not listed: app_1 (RUNNING, user=bob), of the same name but not an mpilaunch job\n")
