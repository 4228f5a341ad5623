"""The MPIJob the peer benchmark and its test submit (testbeds/k8s/mpi_operator.py)."""

from testbeds.k8s import mpi_operator as mo


def test_mpi_operator_mpijob_has_launcher_mpirun_and_sshd_workers():
    job = mo.mpijob("pi", "img:1", 2, 2, ["python3", mo.PROGRAM], placement={"nodeSelector": {"a": "b"}})
    spec = job["spec"]
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert spec["slotsPerWorker"] == 2 and spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["restartPolicy"] == "Never" and worker["replicas"] == 2
    lc = launcher["template"]["spec"]["containers"][0]
    assert lc["command"] == ["wait-hosts", "mpirun", "-n", "4", "python3", "/home/mpiuser/placement.py"]
    wc = worker["template"]["spec"]["containers"][0]
    assert wc["command"] == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    assert wc["securityContext"] == {"runAsUser": 1000}
    assert worker["template"]["spec"]["nodeSelector"] == {"a": "b"}


def test_mpi_operator_mpijob_extra_fields_reach_pod_and_container():
    extra = {"securityContext": {"runAsNonRoot": True}, "container": {"securityContext": {"runAsUser": 1000}}}
    job = mo.mpijob("pi", "img:1", 1, 1, ["true"], extra=extra, mpirun_args=("--map-by", ":OVERSUBSCRIBE"))
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher["securityContext"] == {"runAsNonRoot": True}
    assert launcher["containers"][0]["securityContext"] == {"runAsUser": 1000}
    assert launcher["containers"][0]["command"][4:6] == ["--map-by", ":OVERSUBSCRIBE"]
