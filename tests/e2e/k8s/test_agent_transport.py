"""``--transport agent`` on kwok pods: mpilaunch's exec agent is each worker pod's main process.

kwok has no kubelet; the testbed's pod runner (``testbeds/k8s/pod_runner.py``)
plays its part for these pods: it runs the pod's container command here, in
mount and UTS namespaces of its own (the pod's hostname, its Secret volume at
its mount path, a private /dev/shm), and SIGTERMs it when the pod is deleted.
The pod IPs are loopback addresses (127.65.I.x), so each agent listens on its
pod's IP as it would on a real pod's. The same transport on real pods:
``test_real_pods.py`` (the cluster launcher's default).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import psutil
import pytest

from mpilaunch.backends.k8s.launch import AGENT_PORT
from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from mpilaunch.rsh_agent import agent_client
from mpilaunch.wire import tls
from support.helpers import REPO, leftover_processes, wait_for, wait_started
from support.k8s import (
    PeakLongRunning,
    access,
    delete_pod_while_running,
    end_launcher_pod,
    in_cluster_env,
    launcher_files,
    leftover_objects,
    start,
    stop,
)

pytestmark = [pytest.mark.k8s, pytest.mark.mpi]

PROGRAM = "tests/programs/unit.py"


def argv(job, tmp_path, *args):
    return [
        sys.executable,
        "-m",
        "mpilaunch",
        "--backend",
        "k8s",
        "--image",
        "mpilaunch:test",
        "--launcher",
        "local",
        "--transport",
        "agent",
        "--name",
        job,
        "--output-dir",
        str(tmp_path / "out"),
        *args,
    ]


def agents_of(job: str) -> dict[str, psutil.Process]:
    """The job's agent processes (the pods' main processes) by worker name."""
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "mpilaunch.agent" in cmd and "--name" in cmd:
            name = cmd[cmd.index("--name") + 1]
            if name.startswith(f"{job}-worker-"):
                found[name] = p
    return found


def test_agent_transport_runs_16_pods_with_no_exec_stream_and_no_pods_exec(kube, k8s_env, tmp_path):
    """Every rank runs in its own pod (hostname = pod name), reached by its agent on the pod IP;
    the job holds no long-running request in kube-apiserver (the exec transport holds one per daemon)."""
    job = "agent-t16"
    peak = PeakLongRunning(kube)
    peak.start()
    try:
        proc = subprocess.run(
            argv(
                job,
                tmp_path,
                "--np",
                "32",
                "--slots-per-worker",
                "2",
                "-q",
                "--",
                sys.executable,
                "-c",
                "import os, socket; print(os.environ['MPILAUNCH_WORKER'], "
                "socket.gethostname(), os.environ['OMPI_COMM_WORLD_RANK'])",
            ),
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        extra = peak.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = sorted(tuple(line.split("] ", 1)[1].split()) for line in proc.stdout.splitlines() if "] " in line)
    assert len(seen) == 32, proc.stdout
    for worker, host, rank in seen:
        assert worker == host == f"{job}-worker-{int(rank) // 2}", seen
    assert extra <= 2 and not peak.detail.get("CONNECT pods/exec"), peak.detail
    assert leftover_objects(kube, job) == []
    wait_for(lambda: agents_of(job) == {}, 30, "the pods' agents to end with their pods")


def test_agent_transport_agent_listens_on_its_pod_ip_only_and_wants_the_secret(kube, k8s_env, tmp_path):
    job = "agent-tsec"
    proc = subprocess.Popen(
        argv(job, tmp_path, "--np", "2", "--slots-per-worker", "1", "-x", "SLEEP=120", "--", sys.executable, PROGRAM),
        cwd=REPO,
        env=k8s_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_started(proc, 2)
        pod = json.loads(kube.kubectl("get", "pod", f"{job}-worker-0", "-o", "json").stdout)
        ip = pod["status"]["podIP"]
        agent = agents_of(job)[f"{job}-worker-0"]
        listening = {(c.laddr.ip, c.laddr.port) for c in agent.net_connections("tcp") if c.status == "LISTEN"}
        assert listening == {(ip, AGENT_PORT)}, listening
        # the Secret's value is what it wants; a stranger on the pod network gets nothing run
        with pytest.raises(agent_client.AgentError):
            agent_client.run_capture(f"{ip}:{AGENT_PORT}", b"not-the-secret", "echo pwned", connect_timeout=5)
        # the worker's Secret volume is its own: the pod sees it at its mount path, this machine does not
        secret = json.loads(kube.kubectl("get", "secret", f"{job}-agent", "-o", "json").stdout)
        assert set(secret["data"]) == {"secret"}
        # ... and it is the job's TLS credential: a MAC secret, a certificate and its key (wire/tls.py)
        assert tls.parse_credential(base64.b64decode(secret["data"]["secret"])).tls
        assert set(pod["metadata"]["ownerReferences"][0].values()) >= {"ConfigMap", job}
    finally:
        proc.send_signal(2)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert leftover_objects(kube, job) == []
    wait_for(lambda: agents_of(job) == {} and leftover_processes(job) == [], 30, "the job's processes to end")


def test_agent_transport_lost_worker_deleted_pod_is_named(kube, k8s_env, tmp_path):
    job = "agent-tlost"
    proc = subprocess.Popen(
        argv(
            job,
            tmp_path,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "-q",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            PROGRAM,
        ),
        cwd=REPO,
        env=k8s_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_started(proc, 2)
    node, out, err, took = delete_pod_while_running(kube, proc, f"{job}-worker-1")
    assert proc.returncode == EXIT_WORKER_LOST, err[-3000:]
    line = next(line for line in err.splitlines() if line.startswith("mpilaunch: error: "))
    assert line.startswith(
        f"mpilaunch: error: worker {job}-worker-1 (pod {job}-worker-1 on node {node}) was lost: pod deleted"
    ), err[-3000:]
    assert took < 30, f"the lost worker was noticed after {took:.0f} s"
    assert leftover_objects(kube, job) == []
    wait_for(lambda: agents_of(job) == {} and leftover_processes(job) == [], 30, "the job's processes to end")


def test_agent_transport_retries_reach_the_replacement_pods_new_agent(kube, k8s_env, tmp_path):
    """--retries 1: the replacement is a new pod with a new agent; attempt 2 reaches it at that pod's address.

    Not "a new IP": kwok hands a freed pod IP out again (seen: the replacement got the deleted
    pod's 127.65.13.1), as a real CNI may. So the relaunch holds at a gate while the test reads
    the replacement pod: another UID, and the address report.json gives for the worker is its own.
    """
    job = "agent-tretry"
    pod = f"{job}-worker-1"
    gate = tmp_path / "gate"
    # the first attempt's ranks sleep until the loss ends them (a short sleep raced the loss under
    # load), a relaunch waits for the gate (tests/programs/attempts.py; kwok's pods are local processes)
    proc = subprocess.Popen(
        argv(
            job,
            tmp_path,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--retries",
            "1",
            "-x",
            "SLEEP=120",
            "-x",
            f"RELAUNCH_GATE={gate}",
            "--",
            sys.executable,
            "tests/programs/attempts.py",
        ),
        cwd=REPO,
        env=k8s_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_started(proc, 2, "started (first attempt)")
        old_uid = kube.kubectl("get", "pod", pod, "-o", "jsonpath={.metadata.uid}").stdout
        kube.kubectl("delete", "pod", pod, "--wait=false")
        wait_started(proc, 2, "started (relaunch)")
        new_uid, new_ip = kube.kubectl(
            "get", "pod", pod, "-o", "jsonpath={.metadata.uid} {.status.podIP}"
        ).stdout.split()
        gate.touch()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert new_uid != old_uid
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(a["exit_code"], a["lost_workers"]) for a in report["attempts"]] == [(5, [pod]), (0, [])]
    assert report["workers"][pod]["pod_ip"] == new_ip
    assert leftover_objects(kube, job) == []
    wait_for(lambda: agents_of(job) == {} and leftover_processes(job) == [], 30, "the job's processes to end")


def test_scale_agent_transport_64_kwok_pods_launch_and_hold_no_exec_stream(kube, k8s_env, tmp_path):
    """64 pods, one rank each, full mpirun: it completes, and the API server holds no stream for it."""
    job = "agent-t64"
    peak = PeakLongRunning(kube)
    peak.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv(job, tmp_path, "--np", "64", "--slots-per-worker", "1", "-q", "--", "true"),
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        extra = peak.stop()
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["exit_code"] for r in report["ranks"]] == [0] * 64
    assert extra <= 2 and not peak.detail.get("CONNECT pods/exec"), peak.detail
    assert leftover_objects(kube, job, timeout=60) == []
    print(f"64 kwok pods, agent transport: {took:.1f} s, {extra} long-running requests")


def test_agent_transport_cluster_launcher_needs_no_pods_exec(kube, k8s_env, tmp_path):
    """The cluster launcher's default transport is the agent: the job's Role grants no pods/exec at
    all, and the launcher pod's entry point (played here with the job's own ServiceAccount token,
    as kwok runs no launcher container) runs the job through the agents with what it has."""
    job = "agent-tcl"
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "--",
            sys.executable,
            "-c",
            "import os; print('on', os.environ['MPILAUNCH_WORKER'])",
        ],
        k8s_env,
    )
    try:

        def launcher_pod():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=launcher")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(launcher_pod, 120, "the launcher pod")
        sa = f"{job}-launcher"
        assert access(kube, sa, "get", "pods", f"{job}-worker-0")
        assert not access(kube, sa, "create", "pods", f"{job}-worker-0", "exec")
        assert not access(kube, sa, "get", "pods", f"{job}-worker-0", "exec")
        role = kube.get_json("role", sa)
        assert all("pods/exec" not in rule["resources"] for rule in role["rules"]), role["rules"]
        launch_json = launcher_files(kube, job, tmp_path)
        pod_env = in_cluster_env(kube, k8s_env, sa, tmp_path / "serviceaccount")
        ran = subprocess.run(
            [sys.executable, "-m", "mpilaunch.backends.k8s.in_cluster.launcher", str(launch_json)],
            cwd=REPO,
            env=pod_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        workers = sorted(line.split("on ", 1)[1] for line in ran.stdout.splitlines() if "on " in line)
        assert workers == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2, ran.stdout
        end_launcher_pod(kube, pod, ran.returncode)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
    finally:
        stop(proc)
    assert leftover_objects(kube, job) == []
    wait_for(lambda: agents_of(job) == {}, 30, "the pods' agents to end with their pods")
