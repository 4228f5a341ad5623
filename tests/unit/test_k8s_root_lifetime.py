"""The lifetime of a job's objects around answers that go missing (issue 49, the lows).

A create the API server stored but whose answer this side never saw (a timeout, a connection
reset: ``Api`` then sends it again and gets 409 AlreadyExists) cannot be produced on demand with
the real API server, so ``ScriptedApi`` stands in for it here: an in-memory namespace with the
API server's uids, labels, ownerReferences and uid preconditions. What ``mpilaunch delete``
removes on the real one is tested on kwok (``tests/e2e/k8s/test_k8s.py``).
"""

from __future__ import annotations

import itertools
import os

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jinja2")

from mpilaunch.backends.k8s import manage
from mpilaunch.backends.k8s.api import PLURALS, Api, ApiError
from mpilaunch.backends.k8s.backend import K8sBackend
from mpilaunch.cli import parse_run
from mpilaunch.core.errors import AllocationError
from mpilaunch.workloads.mpirun import MpirunWorkload


class ScriptedApi:
    """One namespace of objects; ``lose_answer_to``: the plural whose first create is stored and
    then answered with ``lose_with`` (as a lost answer looks to the caller)."""

    namespace = "default"

    def __init__(self, lose_answer_to: str | None = None, lose_with: Exception | None = None):
        self.objects: dict[tuple[str, str], dict] = {}
        self.uids = (f"uid-{n}" for n in itertools.count())
        self.lose_answer_to, self.lose_with = lose_answer_to, lose_with

    collection_path = staticmethod(Api.collection_path)

    def request(self, method, path, body=None, **_):
        if method == "GET":  # the pod watch that wakes the wait loop: refused, so the loop polls
            raise ApiError(403, "Forbidden", "watch is not scripted here")
        assert path.endswith("selfsubjectaccessreviews"), path
        return {"status": {"allowed": True}}

    def check_credentials(self):
        pass

    def create(self, obj, **query):
        if query.get("dryRun"):
            return obj
        plural, name = PLURALS[obj["kind"]], obj["metadata"]["name"]
        if (plural, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
        stored = {**obj, "metadata": {**obj["metadata"], "uid": next(self.uids)}}
        self.objects[(plural, name)] = stored
        if plural == self.lose_answer_to:
            self.lose_answer_to = None
            raise self.lose_with
        return stored

    def get(self, api_version, plural, name=None, namespace="", labelSelector=None, **_):
        if name is not None:
            if (plural, name) not in self.objects:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return self.objects[(plural, name)]
        return {"items": [o for (p, _), o in self.objects.items() if p == plural and self._match(o, labelSelector)]}

    def patch(self, api_version, plural, name, body, namespace=""):
        return self.objects[(plural, name)]

    def delete(self, api_version, plural, name, namespace="", preconditions=None, **_):
        obj = self.objects.get((plural, name))
        if obj is None:
            return
        if preconditions and preconditions.get("uid") != obj["metadata"]["uid"]:
            raise ApiError(409, "Conflict", "Precondition failed: UID in precondition")
        del self.objects[(plural, name)]
        self._collect_garbage()

    def delete_collection(self, api_version, plural, selector, **_):
        for key, obj in list(self.objects.items()):
            if key[0] == plural and self._match(obj, selector):
                del self.objects[key]
        self._collect_garbage()

    def _collect_garbage(self):
        """The garbage collector: an object whose every owner is gone goes too."""
        while True:
            uids = {o["metadata"]["uid"] for o in self.objects.values()}
            dead = [
                key
                for key, o in self.objects.items()
                if (owners := o["metadata"].get("ownerReferences")) and not {r["uid"] for r in owners} & uids
            ]
            if not dead:
                return
            for key in dead:
                del self.objects[key]

    @staticmethod
    def _match(obj, selector):
        if not selector:
            return True
        labels = obj["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))

    def names(self) -> list[str]:
        return sorted(f"{p}/{n}" for p, n in self.objects)


def backend_with(api, tmp_path, name="rl") -> K8sBackend:
    spec, _ = parse_run(
        ["--backend", "k8s", "--image", "img", "--name", name, "--namespace", "default", "--np", "2",
         "--slots-per-worker", "1", "--detach", "--", "true"]
    )  # fmt: skip
    workload = MpirunWorkload.prepare(spec, K8sBackend, name, dict(os.environ))
    backend = K8sBackend(spec, workload.plan, tmp_path, cluster_launcher_allowed=workload.can_use_cluster_launcher)
    backend._creds = {"server": "https://127.0.0.1:6443", "namespace": "default"}
    backend._api = api
    return backend


def test_root_configmap_leak_a_create_stored_but_unanswered_is_deleted_by_release(tmp_path):
    """The root's create timed out after the API server stored it: nothing else of the job exists,
    no reaper, so release() must find that root (it is this process's) and delete it."""
    api = ScriptedApi("configmaps", TimeoutError("timed out"))
    backend = backend_with(api, tmp_path)
    with pytest.raises(TimeoutError):
        backend.allocate()
    assert api.names() == ["configmaps/rl"]
    backend.release()
    assert api.names() == []


def test_root_configmap_leak_a_create_sent_again_and_answered_409_is_the_jobs_own(tmp_path):
    """The answer lost on a kept-alive connection: ``Api`` sends the create again and the API server
    answers 409 AlreadyExists with this very root. That is no other job's: the job goes on, and
    release() deletes all of it."""
    api = ScriptedApi("configmaps", ApiError(409, "AlreadyExists", 'configmaps "rl" already exists'))
    backend = backend_with(api, tmp_path)
    backend.allocate()
    assert "pods/rl-worker-0" in api.names() and "jobs/rl-launcher" in api.names()
    backend.release()
    assert api.names() == []


def test_root_configmap_leak_another_jobs_root_is_neither_taken_nor_deleted(tmp_path):
    api = ScriptedApi()
    other = backend_with(api, tmp_path / "a")
    (tmp_path / "b").mkdir()
    other.allocate()
    before = api.names()
    mine = backend_with(api, tmp_path / "b")
    with pytest.raises(Exception, match="a job named rl already exists"):
        mine.allocate()
    mine.release()
    assert api.names() == before
    other.release()
    assert api.names() == []


def test_root_configmap_leak_a_refused_root_is_not_looked_for(tmp_path):
    api = ScriptedApi("configmaps", ApiError(403, "Forbidden", "configmaps is forbidden"))
    backend = backend_with(api, tmp_path)
    with pytest.raises(AllocationError):
        backend.allocate()
    assert backend.root_sent is False


def test_delete_owned_only_a_label_alone_does_not_make_an_object_the_jobs(tmp_path):
    """``mpilaunch delete X`` and release() delete what X's root owns (and its Jobs' pods), not
    whatever carries the label ``mpilaunch/job=X``."""
    api = ScriptedApi()
    backend = backend_with(api, tmp_path)
    backend.allocate()
    label = {"mpilaunch/job": "rl"}
    foreign = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses", "labels": label}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rl-env-mine", "labels": label}},
    ]
    for obj in foreign:
        api.create(obj)
    root_uid = backend.root_uid
    job_uid = api.objects[("jobs", "rl-launcher")]["metadata"]["uid"]
    launcher_pod = {  # what the Job controller makes: owned by the launcher Job, not by the root
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "rl-launcher-x7k2p",
            "labels": label,
            "ownerReferences": [{"kind": "Job", "uid": job_uid}],
        },
    }
    api.create(launcher_pod)
    manage.delete_job(api, "rl", [], wait=1.0, root_uid=root_uid)
    assert api.names() == ["pods/someone-elses", "secrets/rl-env-mine"]


class SlowClusterApi(ScriptedApi):
    """A loaded cluster: the listed calls fail the given number of times each (``failures``:
    ``{"jobs": [TimeoutError(...)], ...}``), and the garbage collector has not come round yet (at a
    run from nothing's load it took more than a minute)."""

    def __init__(self, failures: dict[str, list[Exception]]):
        super().__init__()
        self.failures = failures
        self.asked: list[str] = []

    def _fail(self, what: str):
        self.asked.append(what)
        if self.failures.get(what):
            raise self.failures[what].pop(0)

    def get(self, api_version, plural, name=None, namespace="", labelSelector=None, **kw):
        if name is None:
            self._fail(f"list {plural}")
        return super().get(api_version, plural, name, namespace, labelSelector, **kw)

    def delete_collection(self, api_version, plural, selector, **kw):
        self._fail(f"deletecollection {plural}")
        return super().delete_collection(api_version, plural, selector, **kw)

    def delete(self, api_version, plural, name, namespace="", preconditions=None, **kw):
        gone = self.failures.get(f"delete {plural}") and getattr(self.failures[f"delete {plural}"][0], "status", 0)
        if gone == 404:  # it went meanwhile: a 404 is what the next delete gets
            self.objects.pop((plural, name), None)
        self._fail(f"delete {plural}")
        return super().delete(api_version, plural, name, namespace, preconditions, **kw)

    def _collect_garbage(self):
        pass


def release_calls(api) -> list[str]:
    """The calls delete_job made for the kinds, before it waits for the pods to go (which lists them)."""
    return api.asked[: api.asked.index("list services")] if "list services" in api.asked else api.asked


def job_pods_left(api) -> list[str]:
    return [n for n in api.names() if n.startswith(("pods/", "services/", "secrets/", "jobs/"))]


@pytest.mark.parametrize(
    "failure",
    [
        TimeoutError("timed out"),  # the call's socket timed out under load
        ApiError(429, "Too Many Requests", "too many requests, please try again later"),  # max-in-flight
        ApiError(503, "Service Unavailable", "the server is currently unable to handle the request"),
        ApiError(504, "Gateway Timeout", "the server was unable to return a response in the time allotted"),
    ],
    ids=["timeout", "429", "503", "504"],
)
@pytest.mark.parametrize("call", ["list jobs", "list pods", "deletecollection pods", "delete configmaps"])
def test_release_leftovers_a_transient_failure_is_asked_again_not_left_to_the_garbage_collector(
    tmp_path, call, failure
):
    """Issue 49 item 4: pods of a job still in the API a minute after mpilaunch exited 0, at a run
    from nothing's load. One of release's calls that failed for the moment (a timeout, the API
    server's 429 or 5xx) left the pods to the garbage collector, whose pace on a loaded control
    plane is more than a minute (an OSError even ended the whole release). Such a call is now
    asked again within release's wait, and nothing is left and nothing reported."""
    api = SlowClusterApi({call: [failure]})
    backend = backend_with(api, tmp_path)
    backend.allocate()
    assert [n for n in api.names() if n.startswith("pods/")], api.names()
    manage.delete_job(api, "rl", backend.created, wait=5.0, root_uid=backend.root_uid)
    assert job_pods_left(api) == [] and "configmaps/rl" not in api.names(), api.names()
    assert release_calls(api).count(call) == 2, api.asked


def test_release_leftovers_a_call_failing_past_the_wait_is_reported_and_the_rest_still_deleted(tmp_path):
    """An API server that keeps refusing one kind: release gives up on it at its deadline, says so,
    and still deletes every other kind (the failure reaches the user's warning line)."""
    api = SlowClusterApi({"list jobs": [ApiError(503, "Service Unavailable", "etcd is down")] * 100})
    backend = backend_with(api, tmp_path)
    backend.allocate()
    with pytest.raises(RuntimeError, match="jobs: etcd is down"):
        manage.delete_job(api, "rl", backend.created, wait=1.0, root_uid=backend.root_uid)
    assert [n for n in api.names() if n.startswith(("pods/", "services/", "secrets/"))] == []
    assert 2 <= api.asked.count("list jobs") <= 6, api.asked


def test_release_leftovers_a_refusal_is_not_asked_again(tmp_path):
    """403 is an answer, not a hiccup: asked once, reported (pods the user must be able to delete)."""
    api = SlowClusterApi({"list pods": [ApiError(403, "Forbidden", "pods is forbidden")]})
    backend = backend_with(api, tmp_path)
    backend.allocate()
    with pytest.raises(RuntimeError, match="pods: pods is forbidden"):
        manage.delete_job(api, "rl", backend.created, wait=5.0, root_uid=backend.root_uid)
    assert release_calls(api).count("list pods") == 1, api.asked


def test_release_leftovers_one_pod_gone_meanwhile_does_not_stop_the_rest(tmp_path):
    """Pods deleted one by one (a labelled pod that is not the job's is among them): one that went
    meanwhile (404: its Job's garbage collection took it between the list and the delete) ended
    the kind's loop, and the pods after it were left to the garbage collector."""
    api = SlowClusterApi({"delete pods": [ApiError(404, "NotFound", 'pods "rl-worker-0" not found')]})
    backend = backend_with(api, tmp_path)
    backend.allocate()
    label = {"mpilaunch/job": "rl"}
    api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a-stranger", "labels": label}})
    manage.delete_job(api, "rl", backend.created, wait=2.0, root_uid=backend.root_uid)
    assert [n for n in api.names() if n.startswith("pods/")] == ["pods/a-stranger"], api.names()
