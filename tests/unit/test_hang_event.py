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
