"""The hang verdict as a Kubernetes Event (backends/k8s/hang_event.py): what `kubectl describe pod` shows."""

from mpilaunch.backends.k8s import hang_event

POD = {"metadata": {"name": "job-launcher-x7k2p", "uid": "0f6c-uid"}}
VERDICT = (
    "mpilaunch: hang: rank 2 (job-worker-1) is in time.sleep at train.py:12; the 3 other ranks are in MPI_Allreduce"
)


def test_hang_event_is_a_warning_about_that_pod_by_uid():
    e = hang_event.hang_event("team-a", POD, VERDICT, now=0)
    assert (e["type"], e["reason"], e["message"]) == ("Warning", "Hang", VERDICT)
    # describe matches an event to its pod by uid, not by name alone
    assert e["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "job-launcher-x7k2p",
        "namespace": "team-a",
        "uid": "0f6c-uid",
    }
    assert e["metadata"] == {"generateName": "job-launcher-x7k2p.hang-", "namespace": "team-a"}
    assert e["firstTimestamp"] == e["lastTimestamp"] == "1970-01-01T00:00:00Z"


def test_hang_event_a_long_verdict_is_cut_to_what_an_event_keeps():
    message = hang_event.hang_event("ns", POD, "x" * 5000)["message"]
    assert len(message) == hang_event.MESSAGE_MAX and message.endswith("...")


def test_hang_event_detached_launcher_names_its_own_pod_from_the_downward_api(tmp_path):
    """Issue 49, item 6: a detached job's launcher may not read its own pod (its per-job Role names the
    workers only; the Job controller names the launcher's pod), so the Event's pod comes from the
    downward API: POD_NAME and POD_UID in the launcher container, and no read before the create."""
    import os

    from mpilaunch.backends.k8s.backend import K8sBackend
    from mpilaunch.cli import parse_run
    from mpilaunch.workloads.mpirun import MpirunWorkload

    class CreateOnly:  # the calls a detached launcher makes; a read would fail the test
        def __init__(self):
            self.created = []

        def create(self, obj):
            self.created.append(obj)

    api = CreateOnly()
    hang_event.post_on_own_pod(api, "team-a", {"POD_NAME": "dj-launcher-x7k2p", "POD_UID": "0f6c-uid"}, VERDICT)
    (event,) = api.created
    assert event["involvedObject"]["name"] == "dj-launcher-x7k2p" and event["involvedObject"]["uid"] == "0f6c-uid"

    spec, _ = parse_run(["--backend", "k8s", "--image", "img", "--name", "dj", "--np", "2", "--detach", "--", "true"])
    workload = MpirunWorkload.prepare(spec, K8sBackend, "dj", dict(os.environ))
    backend = K8sBackend(spec, workload.plan, tmp_path)
    (launcher,) = [o for _, o in backend.objects() if o["kind"] == "Job" and o["metadata"]["name"] == "dj-launcher"]
    env = {e["name"]: e.get("valueFrom") for e in launcher["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
