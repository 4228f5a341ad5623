"""The YARN backend against a real YARN (testbeds/yarn): RM + 3 NodeManagers.

NodeManagers 0 and 1 are the default partition, NodeManager 2 carries the
exclusive node label ``gpu`` (queue ``ml`` only); each has 4 fake GPUs
(``yarn.io/gpu``; the fake nvidia-smi is on the containers' PATH). One
cluster serves the whole module. Set MPILAUNCH_YARN_TESTBED_DIR to the
workdir of a cluster started with ``python -m testbeds.yarn.cluster up
--nodemanagers 3 --workdir DIR`` to reuse it.

Programs that must be observed while they run print one JSON line per rank
and then wait for a release file, so the test can compare what the ranks say
with what the ResourceManager reports for the live application.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from mpilaunch.core.exit_codes import EXIT_WORKER_LOST
from support.helpers import REPO, assert_intel_allreduce_placed, mpilaunch_env, wait_for, wait_started
from support.yarn import app_by_name, assert_released, describe_app, proc_cmdline, proc_environ, start

pytestmark = pytest.mark.yarn

HOLD = r"""
import json, os, sys, time
if os.environ.get("USE_MPI", "1") == "1":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, total = comm.rank, comm.allreduce(comm.rank + 1, op=MPI.SUM)
else:
    rank, total = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1")), None
print("RANKINFO " + json.dumps({
    "rank": rank, "sum": total,
    "worker": os.environ.get("MPILAUNCH_WORKER"),
    "container": os.environ.get("CONTAINER_ID"),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "marker": os.environ.get("ENV_ARCHIVE_MARKER"),
    "cwd": os.getcwd(),
}), flush=True)
release = os.environ.get("RELEASE_FILE")
deadline = time.time() + 300
while release and not os.path.exists(release) and time.time() < deadline:
    time.sleep(0.2)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def read_ranks(proc, count, timeout=180):
    """RANKINFO lines from the job's stdout, as they are printed."""
    ranks, seen = [], []
    deadline = time.monotonic() + timeout
    while len(ranks) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "RANKINFO " in line:
            ranks.append(json.loads(line.split("RANKINFO ", 1)[1]))
    assert len(ranks) == count, "".join(seen) + proc.stderr.read() if proc.poll() is not None else "".join(seen)
    return sorted(ranks, key=lambda r: r["rank"])


def worker_containers(yarn, app_id):
    """RM view of the running worker containers (the AM's is _000001)."""
    return {c["containerId"]: c for c in yarn.app_containers(app_id) if not c["containerId"].endswith("_000001")}


def node_index(yarn, node_id):
    return next(nm["index"] for nm in yarn.nodemanagers if nm["node_id"] == node_id)


def secret_of(name):
    """The submitting side's secret file (the launcher container's rundir is ``...-launcher-...``)."""
    paths = [p for p in glob.glob(f"/tmp/mpilaunch-{name}-*/secret") if f"mpilaunch-{name}-launcher-" not in p]
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return f.read().strip()


def launcher_mpiruns(name):
    """pid -> environ of the mpirun the launcher container runs (its MPILAUNCH_CONTEXT is its own)."""
    found = {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        env = proc_environ(pid)
        if f"/mpilaunch-{name}-launcher-" in env.get("MPILAUNCH_CONTEXT", "") and b"--hostfile" in proc_cmdline(pid):
            found[pid] = env
    return found


def local_mpiruns(name):
    return [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if f"/mpilaunch-{name}-" in proc_environ(pid).get("MPILAUNCH_CONTEXT", "")
        and f"/mpilaunch-{name}-launcher-" not in proc_environ(pid).get("MPILAUNCH_CONTEXT", "")
        and b"--hostfile" in proc_cmdline(pid)
    ]


def processes_mentioning(text):
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    if text.encode() in f.read():
                        hits.append(f"{pid} {what}")
            except OSError:
                pass
    return hits


@pytest.mark.parametrize("launcher", ["auto", "local"])
def test_allreduce_in_two_containers_secret_stays_secret(yarn, openmpi_env, tmp_path, launcher):
    """auto is the cluster launcher: mpirun runs in a third container of the application."""
    name = f"yarn-place-{launcher}"
    (tmp_path / "hold.py").write_text(HOLD)
    release = tmp_path / "release"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            launcher,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "512 MiB",
            "--vcores",
            "2",
            "--output-dir",
            str(tmp_path / "out"),
            "-q",
            "-x",
            f"RELEASE_FILE={release}",
            "--",
            sys.executable,
            str(tmp_path / "hold.py"),
        ],
        openmpi_env,
    )
    try:
        ranks = read_ranks(proc, 4)
        app = app_by_name(yarn, name)
        assert app["state"] == "RUNNING" and app["queue"].endswith("default")
        rm = worker_containers(yarn, app["id"])
        launcher_container = None
        if launcher == "auto":
            # mpirun runs in the launcher container, which the RM lists, and not here.
            mpiruns = launcher_mpiruns(name)
            assert len(mpiruns) == 1, mpiruns
            launcher_container = next(iter(mpiruns.values()))["CONTAINER_ID"]
            assert launcher_container in rm, (launcher_container, list(rm))
            assert local_mpiruns(name) == []
            launcher_res = rm.pop(launcher_container)["allocatedResources"]
            from testbeds.yarn.hadoop import resource_value

            assert resource_value(launcher_res, "yarn.io/gpu") == 0
        else:
            assert len(local_mpiruns(name)) == 1 and launcher_mpiruns(name) == {}
        assert len(rm) == 2
        for c in rm.values():
            res = c["allocatedResources"]
            from testbeds.yarn.hadoop import resource_value

            assert resource_value(res, "memory-mb") == 512
            assert resource_value(res, "vcores") == 2
            assert resource_value(res, "yarn.io/gpu") == 0
        # Every rank ran in the container the RM gave its worker.
        assert {r["sum"] for r in ranks} == {10}
        assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2
        by_worker = {}
        for r in ranks:
            by_worker.setdefault(r["worker"], set()).add(r["container"])
        assert all(len(cs) == 1 for cs in by_worker.values()), by_worker
        assert {next(iter(cs)) for cs in by_worker.values()} == set(rm)
        assert launcher_container not in {r["container"] for r in ranks}

        # The secret: on no command line or environment, in no launch script.
        secret = secret_of(name)
        assert len(secret) >= 32
        if launcher == "auto":  # the launcher container's copy: same secret, a private file
            copies = glob.glob(f"/tmp/mpilaunch-{name}-launcher-*/secret")
            assert len(copies) == 1, copies
            assert os.stat(copies[0]).st_mode & 0o077 == 0
            with open(copies[0]) as f:
                assert f.read().strip() == secret
        assert processes_mentioning(secret) == []
        scripts = glob.glob(os.path.join(yarn.workdir, "nm*", "**", "launch_container.sh"), recursive=True)
        ours = [s for s in scripts if app["id"].split("_", 1)[1] in s]
        assert len(ours) >= 3 + (launcher == "auto")  # AM + 2 workers (+ launcher), local and/or log dir copies
        for script in ours:
            with open(script, errors="replace") as f:
                assert secret not in f.read(), script
    finally:
        release.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {w["container"] for w in report["workers"].values()} == set(rm)
    assert report["timings"]["allocate_s"] > 0
    assert_released(yarn, name, "SUCCEEDED")
    if launcher == "auto":  # what the launcher container did, in its own log (a stalled job's diagnostic)
        logs = yarn.container_logs(app["id"])
        said = [
            line.split("mpilaunch-yarn-launcher: ", 1)[1]
            for line in logs.splitlines()
            if "mpilaunch-yarn-launcher: " in line
        ]
        assert len(said) == 2 and said[0].startswith("mpirun started (pid ") and said[1] == "the job ended: exit 0", (
            logs
        )


def test_gpus_8_per_node_4_containers_get_4_gpus_each(yarn, openmpi_env, tmp_path):
    name = "yarn-gpu8"
    (tmp_path / "hold.py").write_text(HOLD)
    release = tmp_path / "release"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            "local",
            "--gpus",
            "8",
            "--gpus-per-node",
            "4",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            f"RELEASE_FILE={release}",
            "-x",
            "USE_MPI=0",
            "--",
            sys.executable,
            str(tmp_path / "hold.py"),
        ],
        openmpi_env,
    )
    try:
        ranks = read_ranks(proc, 8)
        app = app_by_name(yarn, name)
        rm = worker_containers(yarn, app["id"])
        from testbeds.yarn.hadoop import resource_value

        assert sorted(resource_value(c["allocatedResources"], "yarn.io/gpu") for c in rm.values()) == [4, 4]
        # The default partition is NodeManagers 0 and 1: one 4-GPU container each.
        assert sorted(node_index(yarn, c["nodeId"]) for c in rm.values()) == [0, 1]
        assert yarn.app_resources(app["id"])[""]["yarn.io/gpu"] == 8
        for r in ranks:
            assert r["cuda"] == "0,1,2,3", r  # the container's GPUs, physical ids
        assert {r["container"] for r in ranks} == set(rm)
    finally:
        release.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert_released(yarn, name, "SUCCEEDED")


def test_rank_failure_on_labelled_node_fails_the_application(yarn, openmpi_env, tmp_path):
    """Under the cluster launcher: the rank's status line comes back through the launcher container."""
    name = "yarn-fail"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            "cluster",
            "--gpus",
            "4",
            "--queue",
            "ml",
            "--node-label",
            "gpu",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            "FAIL_RANK=2",
            "-x",
            "FAIL_CODE=7",
            "-x",
            "SLEEP=60",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 7, out + err
    assert f"rank 2 on worker {name}-worker-0 exited with code 7" in err
    assert "rank 2 about to fail" in err
    app = assert_released(yarn, name, "FAILED")
    assert app["queue"].endswith("ml")
    # tf-yarn style report: the worker container, its host and state.
    # (worker and launcher containers are requested together: either may be _000002)
    prefix = f"container_{app['id'].split('_', 1)[1]}_01_00000"
    report = {
        line.split()[0]: line.split()[1]
        for line in err.splitlines()
        if line.startswith(f"  {name}-") and prefix in line
    }
    assert set(report) == {f"{name}-worker-0", f"{name}-launcher"}, err
    assert sorted(report.values()) == [prefix + "2", prefix + "3"], err
    # The worker ran on the labelled NodeManager, with GPUs accounted by the RM.
    logs = glob.glob(os.path.join(yarn.nodemanagers[2]["log_dir"], app["id"], report[f"{name}-worker-0"]))
    assert logs, "worker container did not run on the gpu-labelled node"
    gpu_seconds = [e for e in (app.get("resourceSecondsMap") or {}).get("entry", []) if e["key"] == "yarn.io/gpu"]
    assert gpu_seconds and int(gpu_seconds[0]["value"]) > 0, app.get("resourceSecondsMap")


def test_lost_worker_killed_agent_is_named_first_with_its_container(yarn, openmpi_env):
    name = "yarn-kill"
    proc = start(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    wait_started(proc, 4, timeout=180, context=lambda: describe_app(yarn, name))
    victim = [
        int(p)
        for p in filter(str.isdigit, os.listdir("/proc"))
        if f"--name\0{name}-worker-1\0".encode() in proc_cmdline(int(p)) and b"mpilaunch.agent" in proc_cmdline(int(p))
    ]
    assert len(victim) == 1
    container = proc_environ(victim[0]).get("CONTAINER_ID")
    t0 = time.monotonic()
    os.kill(victim[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == EXIT_WORKER_LOST == 5, out + err
    first = next(line for line in err.splitlines() if line.startswith("mpilaunch: error: "))
    assert first.startswith(f"mpilaunch: error: worker {name}-worker-1 (container {container} on "), err
    assert " was lost: " in first and first.endswith("; ranks 2-3 ran there"), first
    report_line = [line for line in err.splitlines() if container in line and line.startswith("  ")]
    assert report_line and f"{name}-worker-1" in report_line[0] and "FAILED" in report_line[0], err
    assert_released(yarn, name, "FAILED")


def test_ctrl_c_kills_the_application(yarn, openmpi_env):
    name = "yarn-sigint"
    proc = start(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    started = 0
    deadline = time.monotonic() + 180
    while started < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        started += "started" in line
    assert started == 2
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert_released(yarn, name, "KILLED")


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_sigkill_of_mpilaunch_the_driver_ends_the_application(yarn, openmpi_env, launcher):
    """SIGKILL of mpilaunch stops its heartbeat; the application's driver (the reaper, in the
    ApplicationMaster's container) ends it once --orphan-timeout passed: final status KILLED
    with a diagnostic naming the timeout, no container left (RM REST API), no process left on
    any NodeManager or on this host, and no `mpilaunch delete`."""
    name = f"yarn-sigkill-{launcher}"
    orphan_timeout = 10
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            launcher,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "--orphan-timeout",
            str(orphan_timeout),
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    try:
        wait_started(proc, 2, context=lambda: describe_app(yarn, name))
        app = app_by_name(yarn, name)
        assert len(worker_containers(yarn, app["id"])) == (3 if launcher == "cluster" else 2)
        time.sleep(orphan_timeout + 2)  # attached: the heartbeat keeps it alive past the timeout
        assert yarn.app_info(app["id"])["state"] == "RUNNING"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)  # not communicate(): mpirun (--launcher local) still holds the pipes
        t_kill = time.monotonic()
        ended = yarn.wait_app(app["id"], timeout=orphan_timeout + 30)
        ended_s = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ended_s >= orphan_timeout - 5, f"ended {ended_s:.1f}s after SIGKILL: before the orphan timeout"
    assert ended["finalStatus"] == "KILLED", ended
    assert "no heartbeat from the submitting mpilaunch" in ended["diagnostics"], ended["diagnostics"]
    assert "--orphan-timeout 10s" in ended["diagnostics"]
    # the RM lists the containers until their NodeManagers report them killed
    assert wait_for(lambda: yarn.app_containers(ended["id"]) == [], 30, "the containers to be released")
    released = assert_released(yarn, name, "KILLED")
    print(
        f"{name}: application {released['id']} ended {ended_s:.1f}s after SIGKILL, everything released "
        f"{time.monotonic() - t_kill:.1f}s after (--orphan-timeout {orphan_timeout})"
    )


def test_timeout_is_enforced_by_the_driver_after_sigkill(yarn, openmpi_env):
    """--timeout outlives mpilaunch: with an orphan timeout far away, the application's driver
    ends it at --start-timeout + --timeout + 30 s, final status FAILED, saying why."""
    name = "yarn-sigkill-deadline"
    # the start bound leaves a loaded machine's ApplicationMaster time to register: CI's four parts
    # side by side on 2 cores had it unregistered after 20 s and after 45 s
    start_timeout, timeout = 90, 5
    deadline_s = start_timeout + timeout + 30
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            "local",
            "--np",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "--orphan-timeout",
            "600",
            "--start-timeout",
            str(start_timeout),
            "--timeout",
            str(timeout),
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=300",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    try:
        wait_started(proc, 1, context=lambda: describe_app(yarn, name))
        app = app_by_name(yarn, name)
        t_started = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()  # not ended by mpilaunch itself
        ended = yarn.wait_app(app["id"], timeout=deadline_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ended["finalStatus"] == "FAILED", ended
    assert "mpilaunch: the job ran past its cluster-side deadline" in ended["diagnostics"], ended["diagnostics"]
    assert ended["finishedTime"] - ended["startedTime"] >= (deadline_s - 3) * 1000  # ms; not before the deadline
    assert wait_for(lambda: yarn.app_containers(ended["id"]) == [], 30, "the containers to be released")
    assert_released(yarn, name, "FAILED")
    print(
        f"{name}: ended {time.monotonic() - t_started:.1f}s after its ranks started "
        f"(deadline {deadline_s} s after the driver's start)"
    )


def test_timeout_under_the_cluster_launcher(yarn, openmpi_env):
    name = "yarn-timeout"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            "cluster",
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "--timeout",
            "8",
            "-x",
            "FAIL_RANK=-1",
            "-x",
            "SLEEP=120",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        openmpi_env,
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 124, out + err
    assert out.count("started") == 2, out + err  # output arrived while mpirun ran
    assert "ran past --timeout 8s" in err
    assert_released(yarn, name, "FAILED")


def test_status_logs_delete_by_name(yarn, openmpi_env, tmp_path):
    name = "yarn-manage"
    (tmp_path / "hold.py").write_text(HOLD)
    proc = start(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            f"RELEASE_FILE={tmp_path / 'never'}",
            "-x",
            "USE_MPI=0",
            "--",
            sys.executable,
            str(tmp_path / "hold.py"),
        ],
        openmpi_env,
    )
    try:
        read_ranks(proc, 2)
        app_id = app_by_name(yarn, name)["id"]

        def manage(*args):
            return subprocess.run(
                [sys.executable, "-m", "mpilaunch", *args, name, "--backend", "yarn"],
                cwd=REPO,
                env=openmpi_env["env"],
                capture_output=True,
                text=True,
                timeout=120,
            )

        status = manage("status")
        assert status.returncode == 0, status.stderr
        assert app_id in status.stdout and "state=RUNNING" in status.stdout
        logs = manage("logs")
        assert logs.returncode == 0, logs.stderr
        assert f"worker {name}-worker-1 in container_" in logs.stdout  # the container's own log
        delete = manage("delete")
        assert delete.returncode == 0 and f"killed {app_id}" in delete.stdout, delete.stdout + delete.stderr
        # The job notices its application is gone.
        out, err = proc.communicate(timeout=60)
        assert proc.returncode != 0, out + err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # mpilaunch then kills its application
            proc.communicate(timeout=60)
    assert_released(yarn, name, "KILLED")
    missing = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "status", "no-such-job", "--backend", "yarn"],
        cwd=REPO,
        env=openmpi_env["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "no YARN application named 'no-such-job'" in missing.stderr


SKEIN_SUBMIT = r"""
import sys, skein
name, tags = sys.argv[1], set(sys.argv[2:])
spec = skein.ApplicationSpec(name=name, queue="default", tags=tags, max_attempts=1, master=skein.Master(
    resources=skein.Resources(memory=128, vcores=1), script="sleep 600"))
with skein.Client(security=skein.Security.new_credentials()) as client:
    print(client.submit(spec), flush=True)
"""


def submit_with_skein(yarn, env, name, *tags):
    """An application submitted with skein directly, not by mpilaunch: its id, once RUNNING."""
    out = subprocess.run(
        [sys.executable, "-c", SKEIN_SUBMIT, name, *tags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    app_id = out.split()[-1]
    wait_for(lambda: yarn.app_info(app_id)["state"] == "RUNNING", 90, f"{app_id} to run")
    return app_id


def test_delete_refuses_an_application_mpilaunch_did_not_submit(yarn, openmpi_env):
    """An application of the job's name that mpilaunch did not submit (no `mpilaunch` tag) is
    no job: delete, status and logs say so (exit 2) and it runs on. One tagged but submitted
    by another user is not deleted either; the user's own is, and the foreign one still runs."""
    name = "yarn-foreign"

    def manage(*args, **env):
        return subprocess.run(
            [sys.executable, "-m", "mpilaunch", *args[:1], name, *args[1:], "--backend", "yarn"],
            cwd=REPO,
            env={**openmpi_env["env"], **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def state(app_id):
        return yarn.app_info(app_id)["state"]

    apps = []
    try:
        foreign = submit_with_skein(yarn, openmpi_env["env"], name)
        apps.append(foreign)
        for action in (["delete"], ["status"], ["logs"], ["logs", "-f"]):
            r = manage(*action)
            assert r.returncode == 2, (action, r.stdout, r.stderr)
            assert r.stderr.startswith(
                f"mpilaunch: error: YARN application {name!r} ({foreign}) is not an mpilaunch job"
            ), (action, r.stderr)
            assert "\n  hint: " in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr
        assert state(foreign) == "RUNNING"  # refused, nothing killed

        # tagged as mpilaunch's (what marks a job), under the same name: not someone else's to delete
        ours = submit_with_skein(yarn, openmpi_env["env"], name, "mpilaunch")
        apps.append(ours)
        user = yarn.app_info(ours)["user"]
        r = manage("delete", HADOOP_USER_NAME="someone-else")
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.startswith(
            f"mpilaunch: error: YARN application {name!r} is not yours to delete "
            f"({ours} submitted by {user}; you are someone-else)"
        ), r.stderr
        assert "\n  hint: " in r.stderr and r.stdout == ""
        assert state(foreign) == state(ours) == "RUNNING"

        # the user's own is killed; the foreign one is left, and said so
        r = manage("delete")
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"killed {ours} ({name})\nleft {foreign} ({name}) RUNNING: not an mpilaunch job\n", r.stdout
        assert yarn.wait_app(ours, timeout=30)["state"] == "KILLED"
        assert state(foreign) == "RUNNING"
        status = manage("status")
        assert status.returncode == 0, status.stderr
        assert f"{ours}  {name}  Killed" in status.stdout, status.stdout
        assert (
            f"not listed: {foreign} (RUNNING, user={user}), of the same name but not an mpilaunch job" in status.stdout
        ), status.stdout
    finally:
        for app_id in apps:  # the test's own applications: killed by the test
            if state(app_id) not in ("FINISHED", "FAILED", "KILLED"):
                yarn.kill_app(app_id)
            yarn.wait_app(app_id, timeout=30)
    assert state(foreign) == "KILLED"


def test_allocation_timeout_reports_pending_requests_and_kills(yarn, openmpi_env):
    name = "yarn-toobig"
    proc = start(
        [
            "--name",
            name,
            "--gpus",
            "8",
            "--gpus-per-node",
            "4",
            "--queue",
            "ml",
            "--node-label",
            "gpu",
            "--memory",
            "256 MiB",
            "--start-timeout",
            "25",
            "-q",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        openmpi_env,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out + err
    app_id = app_by_name(yarn, name)["id"]
    assert "1 of 2 workers not ready before --start-timeout" in err, err
    assert app_id in err and "1 container requests pending" in err and "yarn.io/gpu=4" in err, err
    assert_released(yarn, name, "KILLED")


# Known flake, not yet understood: timed out at 180 s in 1 of 3 full runs
# (29 s otherwise). Rerun once so it cannot hide a regression that fails twice.
@pytest.mark.flaky(reruns=1)
def test_env_archive_python_runs_agents_and_ranks(yarn, openmpi_env, tmp_path):
    """A tiny packed environment: its bin/python marks the environment, then runs ours."""
    env_dir = tmp_path / "env"
    (env_dir / "bin").mkdir(parents=True)
    wrapper = env_dir / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\nexport ENV_ARCHIVE_MARKER=packed-env\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    archive = tmp_path / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env_dir, arcname=".")
    (tmp_path / "hold.py").write_text(HOLD)
    name = "yarn-envarch"
    proc = start(
        [
            "--name",
            name,
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--memory",
            "256 MiB",
            "-q",
            "--env-archive",
            str(archive),
            "-x",
            "USE_MPI=0",
            "--",
            sys.executable,
            str(tmp_path / "hold.py"),
        ],
        openmpi_env,
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err
    ranks = [json.loads(line.split("RANKINFO ", 1)[1]) for line in out.splitlines() if "RANKINFO " in line]
    assert len(ranks) == 2
    assert {r["marker"] for r in ranks} == {"packed-env"}, ranks
    assert_released(yarn, name, "SUCCEEDED")


def test_dry_run_renders_the_application_with_a_launcher_service(openmpi5):
    pytest.importorskip("skein")
    env = mpilaunch_env(openmpi5)
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "yarn",
            "--name",
            "dry",
            "--gpus",
            "8",
            "--gpus-per-node",
            "4",
            "--queue",
            "ml",
            "--node-label",
            "gpu",
            "--dry-run",
            "--",
            "true",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "instances: 2" in dry.stdout and "gpus: 4" in dry.stdout and "node_label: gpu" in dry.stdout
    assert "queue: ml" in dry.stdout
    # auto = cluster: a launcher service of one container, no GPUs.
    services = dry.stdout.split("services:", 1)[1]
    launcher = services.split("  launcher:", 1)[1].split("\n  worker:", 1)[0]
    assert "instances: 1" in launcher and "gpus: 0" in launcher, launcher
    assert "mpilaunch.backends.yarn.in_cluster.launcher" in services
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "yarn",
            "--launcher",
            "local",
            "--np",
            "2",
            "--dry-run",
            "--",
            "true",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert local.returncode == 0, local.stderr
    assert (
        "yarn.in_cluster.launcher\n" not in local.stdout and "  launcher:" not in local.stdout.split("services:", 1)[1]
    )
    # either way the ApplicationMaster's driver is the reaper (--orphan-timeout, default 60)
    for out in (dry.stdout, local.stdout):
        master = out.split("\nmaster:", 1)[1].split("\nmax_attempts:", 1)[0]
        assert "-m mpilaunch.backends.yarn.in_cluster.driver" in master and "MPILAUNCH_ORPHAN_TIMEOUT: '60'" in master


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["auto", "local"])
def test_intel_allreduce_in_yarn_containers(yarn, intel_env, tmp_path, launcher):
    """Intel MPI's hydra proxies reach the containers through the shim, from this machine or the launcher container."""
    name = f"yarn-intel-{launcher}"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            launcher,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "512 MiB",
            "--vcores",
            "2",
            "--output-dir",
            str(tmp_path),
            "-q",
            "--",
            sys.executable,
            str(REPO / "tests/programs/placement.py"),
        ],
        intel_env,
    )
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert_intel_allreduce_placed(name, out)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["placement"]["verified"] is True
    assert_released(yarn, name, "SUCCEEDED")


@pytest.mark.mpi
def test_intel_rank_failure_in_yarn_names_the_rank(yarn, intel_env):
    name = "yarn-intel-fail"
    proc = start(
        [
            "--name",
            name,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "256 MiB",
            "-q",
            "-x",
            "FAIL_RANK=3",
            "-x",
            "FAIL_CODE=5",
            "-x",
            "SLEEP=60",
            "--",
            sys.executable,
            str(REPO / "tests/programs/fail_rank.py"),
        ],
        intel_env,
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 5, out + err
    assert f"rank 3 on worker {name}-worker-1 exited with code 5" in err
    assert "rank 3 about to fail" in err
    assert_released(yarn, name, "FAILED")


@pytest.mark.parametrize("detach", [False, True])
def test_only_an_attached_application_has_the_reaper_driver(tmp_path, detach):
    """Nobody renews a detached job's heartbeat: its ApplicationMaster runs no reaper (the
    launcher container ends the application, --timeout included). Building the spec only."""
    pytest.importorskip("skein")
    from mpilaunch.backends.yarn.backend import YarnBackend as Backend
    from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan

    spec = JobSpec(
        command=("true",), backend="yarn", name="yarn-drv", np=1, timeout=100, orphan_timeout=20, detach=detach
    )
    plan = Plan(job_name="yarn-drv", workers=(WorkerPlan(name="yarn-drv-worker-0", slots=1, gpus=0),))
    master = Backend(spec, plan, tmp_path).application_spec().master
    if detach:
        assert master.script == "" and "MPILAUNCH_ORPHAN_TIMEOUT" not in master.env
    else:
        assert "-m mpilaunch.backends.yarn.in_cluster.driver" in master.script
        assert master.env["MPILAUNCH_ORPHAN_TIMEOUT"] == "20" and master.env["MPILAUNCH_DEADLINE_S"] == "430"
