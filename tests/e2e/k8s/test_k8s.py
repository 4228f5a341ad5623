"""The Kubernetes backend against a real control plane (testbeds/k8s).

kube-apiserver, controller-manager, scheduler and etcd v1.33 run for real;
kwok fakes 16 nodes x 8 GPUs and runs every command exec'd into a pod as a
local process. kwok gives exec'd commands no pod-specific environment, so
each test gives each worker pod its own (``set_pod_exec``): ``POD_NAME``,
``MPILAUNCH_WORKER`` (how a rank proves it came through *that* pod's exec),
and private TMPDIR / shared-memory directories (two Open MPI "hosts" on one
machine must not share segment names). Pods never run their own command,
so the cluster-launcher test plays the kubelet: it runs the launcher pod's
entry point locally with the job ServiceAccount's own token in an
in-cluster-like environment, then reports its exit status on the pod.

Set MPILAUNCH_K8S_TESTBED_DIR to the workdir of a cluster started with
``python -m testbeds.k8s.cluster up --nodes 16 --gpus 8 --workdir DIR`` to
reuse it instead of starting one.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from mpilaunch.backends.k8s.launch import TRANSPORT
from support.helpers import REPO, leftover_processes, mpilaunch_env, wait_for, wait_started
from support.k8s import (
    access,
    end_launcher_pod,
    end_processes,
    forget_pod_env,
    give_pods_their_env,
    in_cluster_env,
    launcher_files,
    leftover_objects,
    manage_k8s,
    run_reaper_pod,
    start,
    stop,
)

pytestmark = pytest.mark.k8s


def rank_text(line: str) -> str | None:
    """The program's text of one echoed rank line (``[r] text``, or Open MPI's ``[1,r]<stdout>: text``)."""
    m = re.match(r"^\[(?:\d+,)?\d+\](?:<std(?:out|err)>:)?\s?(.*)$", line)
    return m.group(1).strip() if m else None


def ranks_from(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        text = rank_text(line) or line.strip()
        if text.startswith("{") and '"rank"' in text:
            out.append(json.loads(text))
    return sorted(out, key=lambda r: r["rank"])


# ------------------------------------------------------------------ sizing and exec path


def test_gpus_128_makes_16_workers_of_8_and_runs_through_exec(kube, k8s_env, tmp_path):
    """--gpus 128 on 16 x 8-GPU nodes: 16 pods limited to 8 GPUs, slots=8 each, 128 ranks exec'd."""
    job = "k8s-size128"
    give_pods_their_env(kube, job, 16, tmp_path)
    release = tmp_path / "release"
    seen = {}

    def watch():
        def ready():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=worker")["items"]
            root = kube.kubectl("get", "configmap", job, "-o", "json", "--ignore-not-found").stdout
            if len(pods) == 16 and all(p["status"].get("phase") == "Running" for p in pods) and root:
                seen["pods"], seen["root"] = pods, json.loads(root)
                return True
            return False

        try:
            wait_for(ready, 120, "16 running worker pods")
        finally:
            release.touch()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # Every rank waits for the release file, so the pods can be inspected while the job runs.
    waiter = f"while [ ! -e {release} ]; do sleep 0.2; done; echo rank-on-$MPILAUNCH_WORKER"
    try:
        proc = start(["--name", job, "--gpus", "128", "--launcher", "local", "-q", "--", "sh", "-c", waiter], k8s_env)
        try:
            out, err = proc.communicate(timeout=240)
        finally:
            stop(proc)
        watcher.join(timeout=5)
        assert proc.returncode == 0, err[-3000:]
        pods = seen["pods"]
        assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"{job}-worker-{i}" for i in range(16))
        for p in pods:
            (container,) = p["spec"]["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
            assert p["spec"]["hostname"] == p["metadata"]["name"] and p["spec"]["subdomain"] == job
        assert len({p["spec"]["nodeName"] for p in pods}) == 16  # 8 GPUs each: one pod per node
        hostfile = seen["root"]["data"]["hostfile"].split("\n")
        assert [line for line in hostfile if line] == [f"{job}-worker-{i} slots=8" for i in range(16)]
        lines = [t for t in map(rank_text, out.splitlines()) if t and t.startswith("rank-on-")]
        assert len(lines) == 128, out[-3000:] + err[-2000:]
        per_pod = {f"rank-on-{job}-worker-{i}": 0 for i in range(16)}
        for line in lines:
            per_pod[line] += 1
        assert set(per_pod.values()) == {8}, per_pod
    finally:
        forget_pod_env(kube, job, 16)
    assert leftover_objects(kube, job) == []


@pytest.mark.parametrize("relay", ["1", "0"], ids=["relay", "direct"])
def test_allreduce_runs_on_its_pods_through_the_exec_api(kube, k8s_env, tmp_path, relay):
    """A real mpi4py allreduce, 4 ranks on 2 pods x 2 GPUs; each rank proves its pod.

    Both exec paths: the job's relay (default) and one TLS connection per shim."""
    job = f"k8s-allreduce-{relay}"
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = start(
            [
                "--name",
                job,
                "--gpus",
                "4",
                "--gpus-per-node",
                "2",
                "--launcher",
                "local",
                "-q",
                "--output-dir",
                str(tmp_path / "out"),
                "--",
                sys.executable,
                "tests/programs/placement.py",
            ],
            {**k8s_env, "MPILAUNCH_K8S_RELAY": relay},
        )
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    finally:
        forget_pod_env(kube, job, 2)
    ranks = ranks_from(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["sum"] for r in ranks} == {10} and {r["size"] for r in ranks} == {4}
    assert [r["worker"] for r in ranks] == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["exit_code"] == 0
    assert {w["node"] for w in report["workers"].values()} <= {f"node-{i}" for i in range(16)}
    assert leftover_objects(kube, job) == []
    assert leftover_processes(job) == []


def test_mpirun_of_instant_ranks_over_16_pods_ends_every_time(kube, k8s_env, openmpi5, tmp_path):
    """Ranks that exit at once (`true`), one per pod on 16 pods, through the
    job's relay, 4 launches in a row with the argv mpilaunch builds: each must
    end. Open MPI 5's daemons used to lose such a rank (reaped before its pid
    was recorded, mpi.PRRTE_SPAWN_ON_PROGRESS_THREAD) and mpirun then waited
    forever: about half of these launches stalled (benchmarks/bench_k8s.py P4b)."""
    from mpilaunch.backends.k8s.api import resolve
    from mpilaunch.backends.k8s.exec_path import relay as k8s_relay
    from mpilaunch.core import hostfile, mpi
    from mpilaunch.rsh_agent.shim import write_launcher

    job, n = "k8s-instant", 16
    pods = [f"{job}-{i}" for i in range(n)]
    for p in pods:
        (tmp_path / p).mkdir()
    kube.apply([kube.pod_exec(p, env={"TMPDIR": str(tmp_path / p)}) for p in pods])
    kube.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": p, "labels": {"test": job}},
                "spec": {"nodeSelector": {"type": "kwok"}, "containers": [{"name": "worker", "image": "none"}]},
            }
            for p in pods
        ]
    )
    relay = None
    try:
        kube.wait_pods(selector=f"test={job}", count=n, timeout=120)
        context = {
            "transport": TRANSPORT,
            **resolve(str(kube.kubeconfig), None, "default", tmp_path),
            "container": "worker",
            "workers": {p: {"pod": p} for p in pods},
        }
        relay, path = k8s_relay.start(context, tmp_path)
        (tmp_path / "context.json").write_text(json.dumps({**context, "relay": path}))
        info = mpi.detect(openmpi5.mpirun)
        (tmp_path / "hostfile").write_text(hostfile.render([(p, 1) for p in pods], info.hostfile_flavour))
        command = mpi.build_mpirun(
            info,
            ranks=n,
            hosts=n,
            hostfile=str(tmp_path / "hostfile"),
            shim=write_launcher(str(tmp_path / "mpilaunch-rsh")),
            command=["true"],
            environ=k8s_env,
            as_root=os.geteuid() == 0,
        )
        env = {**k8s_env, **command.env, "MPILAUNCH_CONTEXT": str(tmp_path / "context.json"), "TMPDIR": str(tmp_path)}
        for attempt in range(4):
            proc = subprocess.Popen(
                command.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                _out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                pytest.fail(f"launch {attempt} over {n} pods did not end in 30 s")
            assert proc.returncode == 0, err[-2000:]
    finally:
        k8s_relay.stop(relay)
        kube.kubectl("delete", "pods", "-l", f"test={job}", "--wait=false", check=False)
        kube.kubectl("delete", "--ignore-not-found", "--wait=false", *[f"exec/{p}" for p in pods], check=False)


@pytest.mark.mpi
def test_intel_allreduce_on_pods_through_the_exec_api(kube, intel, tmp_path):
    """Intel MPI's hydra proxies exec'd into 2 pods; mpi4py on Intel's library, placement verified."""
    job = "k8s-intel"
    env = mpilaunch_env(
        intel, KUBECONFIG=str(kube.kubeconfig), MPILAUNCH_K8S_PYTHON=sys.executable, MPILAUNCH_K8S_TOOLS="image"
    )
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = start(
            [
                "--name",
                job,
                "--mpirun",
                intel.mpirun,
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--launcher",
                "local",
                "-q",
                "--output-dir",
                str(tmp_path / "out"),
                "--",
                sys.executable,
                "tests/programs/placement.py",
            ],
            env,
        )
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    finally:
        forget_pod_env(kube, job, 2)
    ranks = ranks_from(out)
    assert [r["sum"] for r in ranks] == [10] * 4
    assert all(r["library"].startswith("Intel(R) MPI Library") for r in ranks), ranks[0]["library"]
    assert [r["worker"] for r in ranks] == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["placement"]["verified"] is True
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 20, "the job's processes to end")


# ------------------------------------------------------------------ failures


def test_more_gpus_than_exist_exits_3_with_the_schedulers_reason(kube, k8s_env):
    job = "k8s-toobig"
    t0 = time.monotonic()
    proc = start(
        ["--name", job, "--gpus", "256", "--gpus-per-node", "8", "--start-timeout", "6", "-q", "--", "true"], k8s_env
    )
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, err
    assert "Insufficient nvidia.com/gpu" in err, err
    assert "16 of 32 workers not ready" in err, err
    assert "Traceback" not in err
    assert elapsed < 6 + 40, elapsed
    assert leftover_objects(kube, job) == []


def test_rank_failure_exit_code_and_cleanup(kube, k8s_env, tmp_path):
    job = "k8s-rankfail"
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        # pods have their own environment: the job's variables travel with -x
        proc = start(
            [
                "--name",
                job,
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--launcher",
                "local",
                "-q",
                "-x",
                "FAIL_RANK=2",
                "-x",
                "FAIL_CODE=7",
                "-x",
                "SLEEP=60",
                "--",
                sys.executable,
                "tests/programs/fail_rank.py",
            ],
            k8s_env,
        )
        out, err = proc.communicate(timeout=180)
    finally:
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 7, err[-3000:]
    assert f"rank 2 on worker {job}-worker-1 exited with code 7" in err
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 20, "the job's processes to end")


def test_ctrl_c_releases_everything(kube, k8s_env, tmp_path):
    job = "k8s-ctrlc"
    give_pods_their_env(kube, job, 2, tmp_path)
    try:
        proc = start(
            [
                "--name",
                job,
                "--np",
                "4",
                "--slots-per-worker",
                "2",
                "--launcher",
                "local",
                "-q",
                "-x",
                "FAIL_RANK=-1",
                "-x",
                "SLEEP=120",
                "--",
                sys.executable,
                "tests/programs/fail_rank.py",
            ],
            k8s_env,
        )
        wait_started(proc, 4, timeout=120)
        status = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "status", job, "--backend", "k8s"],
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0 and f"{job}-worker-1" in status.stdout and "Running" in status.stdout
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        assert proc.returncode == 130
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
    assert leftover_objects(kube, job) == []
    wait_for(lambda: leftover_processes(job) == [], 30, "the job's processes to end")


def test_delete_status_logs_wait_refuse_a_configmap_that_is_not_a_job(kube, k8s_env):
    """A ConfigMap named like a job, without mpilaunch's job label (or labelled for another
    job), is no job: status, logs, wait and delete say so (exit 2) and it is still there;
    a detached job is then deleted, every object of it."""
    name, job = "k8s-not-a-job", "k8s-delete-detached"
    kube.kubectl("create", "configmap", name, "--from-literal=plan.json={}")
    try:
        for label in (None, "mpilaunch/job=another-job"):
            if label:
                kube.kubectl("label", "configmap", name, label)
            for action in (["delete"], ["status"], ["logs"], ["logs", "-f"], ["wait", "--timeout", "5"]):
                r = manage_k8s(k8s_env, *action[:1], name, *action[1:])
                assert r.returncode == 2, (action, r.stdout, r.stderr)
                assert r.stderr.startswith(
                    f"mpilaunch: error: configmap {name} in namespace default is not an mpilaunch job ("
                ), (action, r.stderr)
                assert "\n  hint: " in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr
            # refused, and nothing deleted
            assert kube.get_json("configmap", name)["metadata"]["name"] == name
    finally:
        kube.kubectl("delete", "configmap", name, "--ignore-not-found", check=False)

    proc = start(["--name", job, "--np", "2", "--slots-per-worker", "1", "--detach", "-q", "--", "true"], k8s_env)
    out, err = proc.communicate(timeout=120)
    try:
        assert proc.returncode == 0, err[-3000:]
        assert f"mpilaunch delete {job} --backend k8s" in out, out
        status = manage_k8s(k8s_env, "status", job)
        assert status.returncode == 0 and f"job {job}  namespace default  " in status.stdout, (
            status.stdout + status.stderr
        )
        deleted = manage_k8s(k8s_env, "delete", job)
        assert deleted.returncode == 0, deleted.stderr
        assert deleted.stdout == f"deleted job {job} in namespace default\n", deleted.stdout
    finally:
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", "--wait=false", check=False)
    assert leftover_objects(kube, job) == []
    gone = manage_k8s(k8s_env, "delete", job)
    assert gone.returncode == 2 and f"mpilaunch: error: no job {job} in namespace default" in gone.stderr, gone.stderr


def test_delete_owned_only_leaves_what_the_jobs_root_does_not_own(kube, k8s_env):
    """Issue 49: `mpilaunch delete X` deleted whatever carried the label mpilaunch/job=X, also objects
    X's root does not own (someone's pod and Secret labelled so by hand or by a script). It deletes
    what the root owns, and the pods of the Jobs it owns, and leaves the rest."""
    job = "k8s-delete-owned"
    proc = start(["--name", job, "--np", "2", "--slots-per-worker", "1", "--detach", "-q", "--", "true"], k8s_env)
    out, err = proc.communicate(timeout=120)
    label = {"mpilaunch/job": job}
    foreign = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{job}-not-its", "labels": label}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{job}-not-its", "labels": label},
            "spec": {"containers": [{"name": "c", "image": "img"}]},
        },
    ]
    try:
        assert proc.returncode == 0, err[-3000:]
        kube.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in foreign))
        deleted = manage_k8s(k8s_env, "delete", job)
        assert deleted.returncode == 0, deleted.stderr
        left = kube.kubectl("get", "pods,secrets", "-l", f"mpilaunch/job={job}", "-o", "name").stdout.split()
        assert sorted(left) == [f"pod/{job}-not-its", f"secret/{job}-not-its"], left
    finally:
        kube.kubectl("delete", "pod,secret", f"{job}-not-its", "--ignore-not-found", "--grace-period=0", check=False)
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", "--wait=false", check=False)
    assert leftover_objects(kube, job) == []


# ------------------------------------------------------------------ render


def test_render_is_accepted_by_the_api_server(kube, k8s_env, tmp_path):
    job = "k8s-render"
    args = [
        "render",
        "--backend",
        "k8s",
        "--image",
        "mpilaunch:test",
        "--name",
        job,
        "--gpus",
        "32",
        "--node-selector",
        "type=kwok",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--pod-memory",
        "8Gi",
        "--pod-cpu",
        "3500m",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args, "--", "python3", "train.py"],
        cwd=REPO,
        env=k8s_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = tmp_path / "job.yaml"
    manifest.write_text(proc.stdout)
    applied = kube.kubectl("apply", "--dry-run=server", "-f", str(manifest), check=False)
    assert applied.returncode == 0, applied.stderr
    for kind in (
        "configmap/k8s-render ",
        "serviceaccount/k8s-render-launcher",
        "role.rbac.authorization.k8s.io/k8s-render-launcher",
        "rolebinding.rbac.authorization.k8s.io/k8s-render-launcher",
        "service/k8s-render ",
        "pod/k8s-render-worker-3 ",
        "job.batch/k8s-render-launcher",
        "lease.coordination.k8s.io/k8s-render ",
        "serviceaccount/k8s-render-reaper",
        "job.batch/k8s-render-reaper",
    ):
        assert kind in applied.stdout + " ", applied.stdout
    assert leftover_objects(kube, job, timeout=0) == []
    # gang scheduling, rendered (test_gang.py runs Volcano's); scheduler-plugins: coscheduling's old name
    for gang, api_version in (
        ("volcano", "scheduling.volcano.sh/v1beta1"),
        ("coscheduling", "scheduling.x-k8s.io/v1alpha1"),
        ("scheduler-plugins", "scheduling.x-k8s.io/v1alpha1"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "mpilaunch", *args, "--gang", gang, "--", "true"],
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        import yaml

        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        (group,) = [d for d in docs if d["kind"] == "PodGroup"]
        assert group["apiVersion"] == api_version and group["spec"]["minMember"] == 4
        workers = [d for d in docs if d["kind"] == "Pod"]
        (launcher,) = [
            d["spec"]["template"] for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("-launcher")
        ]
        # every pod of the job in the one group, placed by the gang's scheduler
        assert {p["spec"]["schedulerName"] for p in [*workers, launcher]} == {
            {"volcano": "volcano"}.get(gang, "scheduler-plugins-scheduler")
        }
        for pod in [*workers, launcher]:
            meta = pod["metadata"]
            member = (
                (meta.get("annotations") or {}).get("scheduling.k8s.io/group-name")
                if gang == "volcano"
                else meta["labels"].get("scheduling.x-k8s.io/pod-group")
            )
            assert member == group["metadata"]["name"], meta
        # --pod-memory/--pod-cpu: request = limit (Guaranteed QoS), next to the GPUs
        (resources,) = {json.dumps(w["spec"]["containers"][0]["resources"], sort_keys=True) for w in workers}
        assert json.loads(resources) == {
            "limits": {"cpu": "3500m", "memory": "8Gi", "nvidia.com/gpu": 8},
            "requests": {"cpu": "3500m", "memory": "8Gi"},
        }


# ------------------------------------------------------------------ cluster launcher and RBAC


def test_cluster_launcher_runs_with_the_jobs_service_account_only(kube, k8s_env, tmp_path):
    """--launcher cluster --transport exec: the launcher pod's entry point, with the job's own token,
    runs the allreduce through exec; the ServiceAccount may exec into its own pods and no others."""
    job, other = "k8s-cl", "k8s-other"
    give_pods_their_env(kube, job, 2, tmp_path)
    give_pods_their_env(kube, other, 1, tmp_path)
    procs = []
    try:
        # the exec transport: its RBAC is the subject (the agent transport's: test_agent_transport.py)
        procs.append(
            start(
                [
                    "--name",
                    job,
                    "--gpus",
                    "4",
                    "--gpus-per-node",
                    "2",
                    "-q",
                    "--transport",
                    "exec",
                    "--",
                    sys.executable,
                    "tests/programs/placement.py",
                ],
                k8s_env,
            )
        )
        procs.append(start(["--name", other, "--np", "1", "-q", "--transport", "exec", "--", "true"], k8s_env))

        def launcher_pod(name):
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={name},mpilaunch/role=launcher")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(lambda: launcher_pod(job), 120, "the launcher pod")
        wait_for(lambda: launcher_pod(other), 120, "the other job's launcher pod")
        spec = pod["spec"]
        assert spec["serviceAccountName"] == f"{job}-launcher"
        (container,) = spec["containers"]
        assert container["command"][:3] == ["python3", "-m", "mpilaunch.backends.k8s.in_cluster.launcher"]
        launch_json = launcher_files(kube, job, tmp_path)

        # RBAC, decided by the real authorizer
        sa = f"{job}-launcher"
        assert access(kube, sa, "create", "pods", f"{job}-worker-0", "exec")
        assert access(kube, sa, "get", "pods", f"{job}-worker-1")
        assert access(kube, sa, "watch", "pods", f"{job}-worker-1")  # its wait for Ready, one pod by name
        assert not access(kube, sa, "create", "pods", f"{other}-worker-0", "exec")
        assert not access(kube, sa, "get", "pods", f"{other}-worker-0")
        assert not access(kube, sa, "watch", "pods", f"{other}-worker-0")
        assert not access(kube, sa, "watch", "pods", "")  # never the namespace's pods
        assert not access(kube, sa, "create", "pods", "", "")
        assert not access(kube, sa, "list", "pods", "")

        # the pod's in-cluster environment: a TokenRequest token for the job's ServiceAccount
        sa_dir = tmp_path / "serviceaccount"
        pod_env = in_cluster_env(kube, k8s_env, sa, sa_dir)
        ran = subprocess.run(
            [sys.executable, "-m", "mpilaunch.backends.k8s.in_cluster.launcher", str(launch_json)],
            cwd=REPO,
            env=pod_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        ranks = ranks_from(ran.stdout)
        assert [r["worker"] for r in ranks] == [f"{job}-worker-0"] * 2 + [f"{job}-worker-1"] * 2
        assert {r["sum"] for r in ranks} == {10}

        # the same credentials through the same transport, pointed at the other job's pod
        context = {
            "transport": TRANSPORT,
            "in_cluster": True,
            "sa_dir": str(sa_dir),
            "namespace": "default",
            "container": "worker",
            "workers": {"x": {"pod": f"{other}-worker-0"}},
        }
        (tmp_path / "ctx.json").write_text(json.dumps(context))
        denied = subprocess.run(
            [sys.executable, "-m", "mpilaunch.rsh_agent.shim", "x", "echo", "hi"],
            env={**pod_env, "MPILAUNCH_CONTEXT": str(tmp_path / "ctx.json")},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert denied.returncode == 255 and "forbidden" in denied.stderr, denied.stderr
        assert "hi" not in denied.stdout

        # play the kubelet: the launcher container ended with the entry point's status
        end_launcher_pod(kube, pod, ran.returncode)
        out, err = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 0, err[-2000:]
        # kwok serves no pod logs, so no rank's start line reached this side: said, not failed
        assert "placement not verified: no rank reported where it started" in err

        # mpilaunch delete NAME removes a running job; its CLI sees the launcher go
        deleted = subprocess.run(
            [sys.executable, "-m", "mpilaunch", "delete", other, "--backend", "k8s"],
            cwd=REPO,
            env=k8s_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert deleted.returncode == 0, deleted.stderr
        procs[1].communicate(timeout=60)
        assert procs[1].returncode != 0
    finally:
        for p in procs:
            stop(p)
        forget_pod_env(kube, job, 2)
        forget_pod_env(kube, other, 1)
    assert leftover_objects(kube, job) == []
    assert leftover_objects(kube, other) == []


def test_secret_env_cluster_launcher_keeps_values_out_of_configmaps_and_command_lines(kube, k8s_env, tmp_path):
    """--launcher cluster with -x SECRET_TOKEN=VALUE: the value is in no ConfigMap of the
    namespace (the `view` role reads those) and in no pod or Job spec, but in the Secret
    <job>-env, owned by the root ConfigMap and gone with the job; while the ranks run no
    process on this machine (the launcher's mpirun, the shims, the exec'd daemons, the ranks)
    has it on its command line, and every rank saw it."""
    import hashlib

    import psutil

    job = "k8s-secret-env"
    secret = f"s3cr3t-value-{time.time_ns()}"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    release = tmp_path / "release"
    give_pods_their_env(kube, job, 2, tmp_path)
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "-x",
            f"SECRET_TOKEN={secret}",
            "--",
            sys.executable,
            "tests/programs/secret_env.py",
            digest,
            str(release),
        ],
        k8s_env,
    )
    launcher = None
    try:

        def launcher_pod():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=launcher")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(launcher_pod, 120, "the launcher pod")
        root = kube.get_json("configmap", job)
        # nothing a `view` user reads holds the value: ConfigMaps, the pods' and Jobs' specs
        for kinds in ("configmaps", "pods,jobs"):
            listed = kube.kubectl("get", kinds, "-o", "yaml").stdout
            assert secret not in listed, f"the value is in the namespace's {kinds}"
        assert "SECRET_TOKEN" not in root["data"]["launch.json"]
        # the Secret holds it, owned by the root (the garbage collector deletes it with the job)
        stored = kube.get_json("secret", f"{job}-env")
        owner = stored["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ConfigMap", job, root["metadata"]["uid"])
        assert f"SECRET_TOKEN={secret}" in json.loads(base64.b64decode(stored["data"]["launch.json"]))["env"]
        # the launcher pod mounts it (the job's Role gets no access to Secrets)
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["job-secret"]["secret"]["secretName"] == f"{job}-env"
        assert not access(kube, f"{job}-launcher", "get", "secrets", f"{job}-env")

        # play the kubelet: the launcher's entry point with its volumes and its ServiceAccount's token
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpilaunch.backends.k8s.in_cluster.launcher",
                str(launcher_files(kube, job, tmp_path)),
            ],
            cwd=REPO,
            text=True,
            env=in_cluster_env(kube, k8s_env, f"{job}-launcher", tmp_path / "launcher-sa"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        lines = wait_started(launcher, 4, text="SECRET_SEEN")
        on_argv = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if secret in cmd and p.info["pid"] != proc.pid:  # mpilaunch's own: what the user typed
                on_argv.append(f"{p.info['pid']}: {cmd[:200]}")
        assert on_argv == [], on_argv
        seen = sorted(line.split("SECRET_SEEN ", 1)[1].split() for line in lines if "SECRET_SEEN " in line)
        assert [s[0] for s in seen] == [f"rank={r}" for r in range(4)], lines
        assert all(s[2] == "match=yes" for s in seen), lines
        assert {s[1] for s in seen} == {f"worker={job}-worker-0", f"worker={job}-worker-1"}, lines
        release.write_text("")
        out, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, err[-3000:]
        end_launcher_pod(kube, pod, 0)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert secret not in out + err
    finally:
        release.write_text("")
        end_processes(launcher)
        stop(proc)
        forget_pod_env(kube, job, 2)
    assert leftover_objects(kube, job) == []
    assert kube.kubectl("get", "secret", f"{job}-env", "--ignore-not-found", "-o", "name").stdout.strip() == ""


# ------------------------------------------------------------------ SIGKILL of mpilaunch: the cluster reaps the job


def lease_renewals(kube, job: str, seconds: float) -> set[str]:
    """The Lease's renewTime values seen over ``seconds``."""
    seen, end = set(), time.monotonic() + seconds
    while time.monotonic() < end:
        seen.add(kube.get_json("lease", job)["spec"]["renewTime"])
        time.sleep(0.5)
    return seen


ORPHAN_TIMEOUT = 10
MARGIN = 20  # the reaper's poll, the garbage collector, kwok deleting pods


def test_sigkill_local_launcher_the_reaper_deletes_the_job(kube, k8s_env, tmp_path):
    """--launcher local: SIGKILL of mpilaunch stops the Lease's renewals; the reaper pod deletes
    the root after --orphan-timeout and garbage collection removes every object, with no
    `mpilaunch delete`. kwok pods run no containers, so the test plays the kubelet for the
    reaper pod: its own command runs on this host with its ServiceAccount's token, the
    in-cluster credentials the cluster launcher's entry point uses in these tests (on the real
    node the reaper pod itself runs: test_real_pods.py, sigkill)."""
    job = "k8s-sigkill-local"
    give_pods_their_env(kube, job, 2, tmp_path)
    reaper = None
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--launcher",
            "local",
            "-q",
            "--orphan-timeout",
            str(ORPHAN_TIMEOUT),
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        k8s_env,
    )
    try:
        wait_started(proc, 4)
        reaper = run_reaper_pod(kube, k8s_env, job, tmp_path)
        # the reaper's identity: this job's Lease and root, nothing else
        sa = f"{job}-reaper"
        lease_api = "coordination.k8s.io"
        assert access(kube, sa, "get", "leases", job, group=lease_api)
        assert not access(kube, sa, "watch", "leases", job, group=lease_api)  # it reads, never watches (issue 49)
        assert not access(kube, sa, "update", "leases", job, group=lease_api)
        assert not access(kube, sa, "get", "leases", "other-job", group=lease_api)
        assert access(kube, sa, "delete", "configmaps", job)
        assert not access(kube, sa, "delete", "configmaps", "other-job")
        assert not access(kube, sa, "get", "pods", f"{job}-worker-0")
        lease = kube.get_json("lease", job)
        assert lease["metadata"]["ownerReferences"][0]["name"] == job
        # renewed while attached, and the reaper leaves a renewed job alone
        assert len(lease_renewals(kube, job, ORPHAN_TIMEOUT + 2)) >= 3
        assert reaper.poll() is None and leftover_objects(kube, job, timeout=0)

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)  # not communicate(): mpirun, its child, still holds the pipes
        t_kill = time.monotonic()
        assert leftover_objects(kube, job, timeout=ORPHAN_TIMEOUT + MARGIN) == []
        gone_s = time.monotonic() - t_kill
        out, err = reaper.communicate(timeout=30)
        assert reaper.returncode == 0, err
        assert f"deleted job {job}: no heartbeat" in err and "--orphan-timeout 10s" in err
        assert gone_s >= ORPHAN_TIMEOUT - 4, f"reaped {gone_s:.1f}s after SIGKILL: before the orphan timeout"
        wait_for(lambda: leftover_processes(job) == [], MARGIN, "the job's processes to end")
        print(
            f"{job}: objects gone {gone_s:.1f}s after SIGKILL, processes "
            f"{time.monotonic() - t_kill:.1f}s (--orphan-timeout {ORPHAN_TIMEOUT})"
        )
    finally:
        end_processes(proc, reaper)
        forget_pod_env(kube, job, 2)
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", check=False)


def test_sigkill_cluster_launcher_the_reaper_deletes_the_job(kube, k8s_env, tmp_path):
    """--launcher cluster: the same reaper (its own pod, not the launcher's: the launcher pod ends
    with mpirun, and a job whose mpilaunch dies after that must be reaped too) deletes the job
    after SIGKILL of the submitting mpilaunch. The test plays the kubelet for the launcher and
    reaper pods (their commands with their ServiceAccounts' tokens on this host) and, as a
    kubelet does for a deleted pod, SIGTERMs the launcher once its pod is gone."""
    job = "k8s-sigkill-cl"
    give_pods_their_env(kube, job, 2, tmp_path)
    launcher = reaper = None
    proc = start(
        [
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--launcher",
            "cluster",
            "-q",
            "--orphan-timeout",
            str(ORPHAN_TIMEOUT),
            "--timeout",
            "600",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        k8s_env,
    )
    try:

        def launcher_pod():
            pods = kube.get_json("pods", "-l", f"mpilaunch/job={job},mpilaunch/role=launcher")["items"]
            return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

        pod = wait_for(launcher_pod, 120, "the launcher pod")
        # --timeout is enforced by the cluster too: start timeout + timeout + margin
        deadline_s = kube.get_json("job", f"{job}-launcher")["spec"]["activeDeadlineSeconds"]
        assert deadline_s == 300 + 600 + 30
        assert kube.get_json("pod", f"{job}-worker-1")["spec"]["activeDeadlineSeconds"] == deadline_s
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpilaunch.backends.k8s.in_cluster.launcher",
                str(launcher_files(kube, job, tmp_path)),
            ],
            cwd=REPO,
            text=True,
            env=in_cluster_env(kube, k8s_env, f"{job}-launcher", tmp_path / "launcher-sa"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        reaper = run_reaper_pod(kube, k8s_env, job, tmp_path)
        assert (
            "--deadline"
            in kube.get_json("job", f"{job}-reaper")["spec"]["template"]["spec"]["containers"][0]["command"]
        )
        wait_started(launcher, 4)

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t_kill = time.monotonic()
        wait_for(
            lambda: (
                not kube.kubectl(
                    "get", "pod", pod["metadata"]["name"], "--ignore-not-found", "-o", "name"
                ).stdout.strip()
            ),
            ORPHAN_TIMEOUT + MARGIN,
            "the launcher pod's deletion",
        )
        launcher.send_signal(signal.SIGTERM)  # the kubelet's part
        assert leftover_objects(kube, job, timeout=MARGIN) == []
        gone_s = time.monotonic() - t_kill
        _, err = reaper.communicate(timeout=30)
        assert reaper.returncode == 0 and f"deleted job {job}: no heartbeat" in err, err
        launcher.wait(timeout=30)
        wait_for(lambda: leftover_processes(job) == [], MARGIN, "the job's processes to end")
        print(f"{job}: objects gone {gone_s:.1f}s after SIGKILL (--orphan-timeout {ORPHAN_TIMEOUT})")
    finally:
        end_processes(proc, launcher, reaper)
        forget_pod_env(kube, job, 2)
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", check=False)


def test_timeout_is_enforced_by_the_cluster_after_sigkill(kube, k8s_env, tmp_path):
    """--timeout outlives mpilaunch: with an orphan timeout far away, the reaper deletes the job
    at --start-timeout + --timeout + 30 s, the deadline the pods and Job carry too. (The test
    plays the kubelet for the reaper pod, as above.)"""
    job = "k8s-sigkill-deadline"
    give_pods_their_env(kube, job, 1, tmp_path)
    reaper = None
    proc = start(
        [
            "--name",
            job,
            "--np",
            "2",
            "--launcher",
            "local",
            "-q",
            "--orphan-timeout",
            "600",
            "--start-timeout",
            "15",
            "--timeout",
            "15",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            "tests/programs/fail_rank.py",
        ],
        k8s_env,
    )
    try:
        reaper = run_reaper_pod(kube, k8s_env, job, tmp_path)
        t_reaper = time.monotonic()
        assert kube.get_json("pod", f"{job}-worker-0")["spec"]["activeDeadlineSeconds"] == 60
        wait_started(proc, 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL, "mpilaunch ended the job itself before it was killed"
        _, err = reaper.communicate(timeout=60 + MARGIN)
        reaped_s = time.monotonic() - t_reaper
        assert reaper.returncode == 0 and f"deleted job {job}: the job ran past its cluster-side deadline" in err, err
        assert 60 - 3 <= reaped_s, f"reaped {reaped_s:.1f}s after the reaper started: before the deadline"
        assert leftover_objects(kube, job, timeout=MARGIN) == []
        wait_for(lambda: leftover_processes(job) == [], MARGIN, "the job's processes to end")
        print(f"{job}: reaped {reaped_s:.1f}s after the reaper started (deadline 60 s)")
    finally:
        end_processes(proc, reaper)
        forget_pod_env(kube, job, 1)
        kube.kubectl("delete", "configmap", job, "--ignore-not-found", check=False)


@pytest.mark.parametrize("detach", [False, True])
def test_a_detached_job_has_a_reaper_but_no_lease_and_keeps_the_deadline(tmp_path, detach):
    """Nobody renews a detached job's heartbeat, so it gets no Lease; its reaper watches the launcher
    instead (test_k8s_detach.py); --timeout still reaches the cluster as activeDeadlineSeconds.
    Rendering only: no cluster."""
    from mpilaunch.backends.k8s.backend import K8sBackend as Backend
    from mpilaunch.backends.k8s.options import K8sOptions
    from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan

    spec = JobSpec(
        command=("true",),
        backend="k8s",
        name="k8s-detached",
        np=2,
        timeout=100,
        detach=detach,
        backend_options=K8sOptions(image="img", namespace="default"),
    )
    plan = Plan(job_name="k8s-detached", workers=(WorkerPlan(name="k8s-detached-worker-0", slots=2, gpus=0),))
    objects = Backend(spec, plan, tmp_path).objects()
    kinds = {(obj["kind"], obj["metadata"]["name"]) for _, obj in objects}
    assert (("Lease", "k8s-detached") in kinds) == (not detach)
    assert ("Job", "k8s-detached-reaper") in kinds
    pod = next(obj for _, obj in objects if obj["kind"] == "Pod")
    launcher = next(
        obj for _, obj in objects if obj["metadata"]["name"] == "k8s-detached-launcher" and obj["kind"] == "Job"
    )
    assert pod["spec"]["activeDeadlineSeconds"] == launcher["spec"]["activeDeadlineSeconds"] == 300 + 100 + 30


def test_render_with_the_jobs_own_pieces_is_accepted_by_the_api_server(kube, k8s_env, tmp_path):
    """The default for a real cluster: mpilaunch's pieces in the ConfigMap <job>-tools (a ~300 KB
    zip as binaryData), mounted into every pod of the job; the API server takes all of it."""
    job = "k8s-render-tools"
    env = {k: v for k, v in k8s_env.items() if k != "MPILAUNCH_K8S_TOOLS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "render",
            "--backend",
            "k8s",
            "--image",
            "debian:12",
            "--name",
            job,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--",
            "python3",
            "train.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = tmp_path / "job.yaml"
    manifest.write_text(proc.stdout)
    # --server-side: client-side apply would copy the ~300 KB ConfigMap into an annotation (256 KB at most)
    applied = kube.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(manifest), check=False)
    assert applied.returncode == 0, applied.stderr
    assert f"configmap/{job}-tools" in applied.stdout
    import yaml

    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(proc.stdout) if d}
    for kind, name in (("Pod", f"{job}-worker-0"), ("Job", f"{job}-launcher"), ("Job", f"{job}-reaper")):
        spec = docs[(kind, name)]["spec"]
        spec = spec["template"]["spec"] if kind == "Job" else spec
        assert {"name": "mpilaunch-tools", "configMap": {"name": f"{job}-tools", "defaultMode": 365}} in spec["volumes"]
        assert spec["containers"][0]["image"] == "debian:12"
        assert "initContainers" not in spec
