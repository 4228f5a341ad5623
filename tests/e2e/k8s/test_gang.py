"""--gang volcano: jobs under a real Volcano v1.10 (vc-scheduler + vc-controller-manager: testbeds/k8s/volcano.py).

On kwok: two nodes of 8 GPUs of their own (tainted, so no other test's pods
land there, and selected by a label), so the capacity is exact: 16 GPUs.
The classic failures of MPI jobs on a shared cluster, without and with a
gang scheduler: a job that starts with only part of its workers, and two
jobs that each hold half and wait forever. On real pods: a job of the
cluster launcher and its workers, all placed by Volcano as one group.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from support.helpers import wait_for
from support.k8s import forget_pod_env, give_pods_their_env, leftover_objects, start, stop
from support.mpi_installs import require
from support.real_pods import finish, pods_of

POOL = ["--node-selector", "mpilaunch-test/pool=gang", "--toleration", "kwok.x-k8s.io/node=fake:NoSchedule"]
WAIT_FOR_FILE = "while [ ! -e {0} ]; do sleep 0.2; done; echo rank-on-$MPILAUNCH_WORKER"


def start_volcano(cluster):
    try:
        from testbeds.k8s.volcano import Volcano
    except ImportError as e:
        require(f"the Volcano testbed is not importable: {e}")
    try:
        return Volcano(cluster).start()
    except Exception as e:  # the testbed's own error names the cause (not built, not scheduling)
        require(f"Volcano did not start: {e}")


@pytest.fixture(scope="module")
def gang_pool(kube):
    """Volcano on the shared kwok cluster, and the two 8-GPU nodes these tests use."""
    nodes = kube.create_nodes(2, gpus=8, prefix="gang", taint=True, labels={"mpilaunch-test/pool": "gang"})
    volcano = start_volcano(kube)
    yield kube
    volcano.stop()
    kube.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def bound(kube, job: str) -> list[str]:
    """The job's worker pods bound to a node and not being deleted (a finished job's go)."""
    return bound_by_job(kube, [job])[job]


def bound_by_job(kube, jobs: list[str]) -> dict[str, list[str]]:
    """``bound`` for several jobs, read in one list call (so one sample is one moment)."""
    pods = kube.get_json("pods", "-l", f"mpilaunch/job in ({','.join(jobs)}),mpilaunch/role=worker")["items"]
    named = {job: [] for job in jobs}
    for p in pods:
        job = p["metadata"]["labels"]["mpilaunch/job"]
        spare = p["metadata"]["name"].startswith(f"{job}-spare-")  # labelled like the workers it may serve
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp") and not spare:
            named[job].append(p["metadata"]["name"])
    return {job: sorted(names) for job, names in named.items()}


def longest_run(samples: list, pred) -> int:
    """The most consecutive samples for which ``pred`` holds."""
    longest = run = 0
    for sample in samples:
        run = run + 1 if pred(sample) else 0
        longest = max(longest, run)
    return longest


class Watch:
    """Polls the bound worker pods of some jobs until stopped: the most each ever had."""

    def __init__(self, kube, jobs):
        self.kube, self.jobs = kube, jobs
        self.most = dict.fromkeys(jobs, 0)
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.3):
            counts = {job: len(names) for job, names in bound_by_job(self.kube, self.jobs).items()}
            self.samples.append(counts)
            for job, n in counts.items():
                self.most[job] = max(self.most[job], n)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.mark.k8s
def test_gang_starts_all_or_nothing_where_the_default_scheduler_starts_a_part(gang_pool, k8s_env):
    """3 workers of 8 GPUs, 2 nodes of 8: the default scheduler binds 2 of them (GPUs held by a job
    that cannot run); with --gang volcano none is bound. Both end at --start-timeout with exit 3."""
    kube = gang_pool
    seen = {}
    for gang in ("none", "volcano"):
        job = f"k8s-gang-part-{gang}"
        watch = Watch(kube, [job])
        proc = start(
            [
                "--name",
                job,
                "--gpus",
                "24",
                "--gpus-per-node",
                "8",
                "--launcher",
                "local",
                "-q",
                *POOL,
                "--gang",
                gang,
                "--start-timeout",
                "10",
                "--",
                "true",
            ],
            k8s_env,
        )
        try:
            _, err = proc.communicate(timeout=120)
        finally:
            stop(proc)
            watch.stop()
        assert proc.returncode == 3, err[-3000:]
        seen[gang] = watch.most[job]
        assert leftover_objects(kube, job) == []
    assert seen == {"none": 2, "volcano": 0}


@pytest.mark.k8s
def test_gang_unschedulable_reason_in_progress_line_and_exit_3(gang_pool, k8s_env):
    kube = gang_pool
    job = "k8s-gang-toobig"
    proc = start(
        [
            "--name",
            job,
            "--gpus",
            "24",
            "--gpus-per-node",
            "8",
            "--launcher",
            "local",
            *POOL,
            "--gang",
            "volcano",
            "--start-timeout",
            "10",
            "--",
            "true",
        ],
        k8s_env,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err
    # the progress line says why in Volcano's words, while it waits
    progress = [
        x
        for x in err.splitlines()
        if x.startswith("mpilaunch: waiting for 3 workers: 0/3 ready, gang not scheduled (volcano PodGroup ")
    ]
    assert progress, err[-3000:]
    (error,) = [x for x in err.splitlines() if x.startswith("mpilaunch: error:")]
    assert (
        "3 of 3 workers not ready after --start-timeout 10s: gang not scheduled (volcano PodGroup Inqueue): "
        "1/3 tasks in gang unschedulable: pod group is not ready, 3 Pending, 3 minAvailable" in error
    ), error
    # and why, as Volcano's predicates saw it
    # (how many nodes it counts depends on what else the shared cluster holds: 2 on a fresh one, 3 seen)
    assert re.search(r"\b\d+ Insufficient nvidia\.com/gpu", error), error
    assert leftover_objects(kube, job) == []


@pytest.mark.k8s
def test_gang_two_jobs_that_each_need_all_gpus_run_one_after_the_other(gang_pool, k8s_env, tmp_path):
    """Both submitted at once, each needing all 16 GPUs: exactly one runs while the other waits
    holding nothing (no pod of it bound meanwhile); then the other runs. Both exit 0.
    (Without a gang scheduler each may get one node and both wait forever: docs/shared-clusters.md.)"""
    kube = gang_pool
    jobs = ["k8s-gang-twin-a", "k8s-gang-twin-b"]
    release = tmp_path / "release"
    for job in jobs:
        give_pods_their_env(kube, job, 2, tmp_path)
    watch = Watch(kube, jobs)
    procs = {}
    try:
        for job in jobs:
            procs[job] = start(
                [
                    "--name",
                    job,
                    "--gpus",
                    "16",
                    "--gpus-per-node",
                    "8",
                    "--launcher",
                    "local",
                    "-q",
                    *POOL,
                    "--gang",
                    "volcano",
                    "--start-timeout",
                    "240",
                    "--",
                    "sh",
                    "-c",
                    WAIT_FOR_FILE.format(release),
                ],
                k8s_env,
            )
        wait_for(lambda: any(s.get(j) == 2 for s in watch.samples[-1:] for j in jobs), 120, "one job's gang bound")
        time.sleep(3)  # the winner runs (its ranks wait for the release file); the loser must hold nothing
        (winner,) = [j for j in jobs if len(bound(kube, j)) == 2]
        (loser,) = [j for j in jobs if j != winner]
        assert bound(kube, loser) == [] and procs[loser].poll() is None
        release.touch()
        results = {job: procs[job].communicate(timeout=240) for job in jobs}
    finally:
        watch.stop()
        for proc in procs.values():
            stop(proc)
        for job in jobs:
            forget_pod_env(kube, job, 2)
    for job in jobs:
        assert procs[job].returncode == 0, results[job][1][-3000:]
        assert results[job][0].count("rank-on-") == 16
    # Never both at once: no sample has pods of both jobs bound (the deadlock a default scheduler
    # makes is one pod each). Never a part held: a gang's two pods are bound (and deleted) by two
    # API calls, so one sample may fall between them, but a job is never seen at 1 of 2 for long.
    for sample in watch.samples:
        assert sum(1 for n in sample.values() if n) <= 1, sample
    for job in jobs:
        assert longest_run(watch.samples, lambda s: s[job] == 1) <= 3, (job, watch.samples)
    for job in jobs:
        assert leftover_objects(kube, job) == []


@pytest.mark.real_pods
def test_gang_on_real_pods_places_the_launcher_and_workers_as_one_group(real, tmp_path):
    """The cluster launcher and 2 workers on the real node, all three pods placed by Volcano
    (schedulerName volcano, one PodGroup); the job runs and exits 0."""
    volcano = start_volcano(real.cluster)
    job = "rp-gang"
    seen = {}

    def pods_and_group():
        pods = list(pods_of(real, job).values())  # not the reaper's: it runs anywhere, on its own schedule
        group = real.cluster.kubectl(
            "get", "podgroups.scheduling.volcano.sh", job, "-o", "json", "--ignore-not-found"
        ).stdout
        if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) and group.strip():
            seen["pods"], seen["group"] = pods, group
            return True
        return False

    try:
        proc = real.start(
            job,
            "--gang",
            "volcano",
            "--np",
            "2",
            "--slots-per-worker",
            "1",
            "--output-dir",
            str(tmp_path),
            "-x",
            "SLEEP=3",
            "--",
            "python3",
            "/opt/mpilaunch/tests/programs/unit.py",
        )
        try:
            wait_for(pods_and_group, 120, "the job's 3 pods bound and its PodGroup")
        finally:
            out, err = finish(proc, 240)
        assert proc.returncode == 0, err[-3000:]
        pods = seen["pods"]
        assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}
        assert {p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] for p in pods} == {job}
        assert sorted(p["metadata"]["labels"]["mpilaunch/role"] for p in pods) == ["launcher", "worker", "worker"]
        assert real.leftovers(job) == []
    finally:
        volcano.stop()


# ------------------------------------------------------------------ --spares with a gang (issue 52)


def give_spare_its_env(kube, job: str, root) -> str:
    """What give_pods_their_env gives a worker pod, for the job's first spare pod."""
    from support.helpers import REPO

    pod = f"{job}-spare-0"
    d = root / pod
    d.mkdir(parents=True, exist_ok=True)
    env = {
        "POD_NAME": pod,
        "MPILAUNCH_WORKER": pod,
        "TMPDIR": str(d),
        "OMPI_MCA_btl_vader_backing_directory": str(d),
        "OMPI_MCA_btl_sm_backing_directory": str(d),
    }
    kube.set_pod_exec(pod, workdir=str(REPO), env=env)
    return pod


def cluster_view(kube, job: str) -> str:
    """What a failed wait shows: the job's pods and its PodGroup's state."""
    pods = kube.kubectl("get", "pods", "-l", f"mpilaunch/job={job}", "-o", "wide", check=False).stdout
    group = kube.kubectl("get", "podgroups.scheduling.volcano.sh", job, "-o", "jsonpath={.status}", check=False)
    return f"{pods}\npodgroup: {group.stdout or group.stderr}"


def podgroup_min_member(kube, job: str) -> str:
    return kube.kubectl("get", "podgroups.scheduling.volcano.sh", job, "-o", "jsonpath={.spec.minMember}").stdout


@pytest.mark.k8s
def test_gang_spare_outside_the_minimum_never_holds_the_job_back(gang_pool, k8s_env, tmp_path):
    """2 workers of 8 GPUs fill the pool's 16; the spare (8 more) cannot be placed. It is asked for
    once Volcano bound the two workers as one (created with them, it was bound in a worker's place
    and the job never started), stays Pending, and the job runs to its end; nothing is left."""
    kube = gang_pool
    job = "k8s-gang-sp-room"
    release = tmp_path / "release"
    give_pods_their_env(kube, job, 2, tmp_path / "pods")
    proc = start(
        ["--name", job, "--gpus", "16", "--gpus-per-node", "8", "--launcher", "local", "-q", *POOL,
         "--gang", "volcano", "--spares", "1", "--retries", "1", "--", "sh", "-c", WAIT_FOR_FILE.format(release)],
        k8s_env,
    )  # fmt: skip
    try:
        wait_for(
            lambda: len(bound(kube, job)) == 2,
            120,
            "the two workers bound by Volcano",
            detail=lambda: cluster_view(kube, job),
        )
        assert podgroup_min_member(kube, job) == "2"
        spare = wait_for(
            lambda: kube.get_json(
                "pods", "-l", f"mpilaunch/job={job}", "--field-selector", f"metadata.name={job}-spare-0"
            )["items"],
            60,
            "the spare pod, asked for once the workers were placed",
        )[0]
        assert spare["spec"].get("schedulerName") == "volcano"
        assert not spare["spec"].get("nodeName"), "the spare took a node: there was none free"
        release.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        stop(proc)
        forget_pod_env(kube, job, 2)
    assert proc.returncode == 0, err[-3000:]
    ranks = re.findall(r"rank-on-(\S+)", out)  # 8 ranks a worker: one a GPU
    assert len(ranks) == 16 and set(ranks) == {f"{job}-worker-0", f"{job}-worker-1"}, out
    assert leftover_objects(kube, job) == []


@pytest.mark.k8s
def test_gang_spare_takes_a_lost_workers_place(gang_pool, k8s_env, tmp_path):
    """1 worker of 8 GPUs and a spare of 8, under Volcano, --retries 1: the worker's pod is deleted
    mid-run and the spare, bound beside it all along, serves the relaunch under the worker's name."""
    from support.helpers import REPO

    kube = gang_pool
    job = "k8s-gang-sp-swap"
    give_pods_their_env(kube, job, 1, tmp_path / "pods")
    spare = give_spare_its_env(kube, job, tmp_path / "pods")
    proc = start(
        ["--name", job, "--gpus", "8", "--gpus-per-node", "8", "--launcher", "local", "-q", *POOL,
         "--gang", "volcano", "--spares", "1", "--retries", "1", "-x", f"ATTEMPT_MARKER={tmp_path / 'marker'}",
         "--", "python3", str(REPO / "tests" / "programs" / "attempts.py")],
        k8s_env,
    )  # fmt: skip
    try:
        wait_for(lambda: "started (first attempt)" in proc.stdout.readline(), 120, "the first attempt")
        wait_for(lambda: bound(kube, job) == [f"{job}-worker-0"], 30, "the worker bound")
        wait_for(
            lambda: kube.kubectl("get", "pod", spare, "-o", "jsonpath={.status.phase}").stdout == "Running",
            60,
            "the spare running beside it",
        )
        kube.kubectl("delete", "pod", f"{job}-worker-0", "--wait=false")
        out, err = proc.communicate(timeout=180)
    finally:
        stop(proc)
        forget_pod_env(kube, job, 1)
        kube.kubectl("delete", "--ignore-not-found", "--wait=false", f"exec/{spare}", check=False)
    assert proc.returncode == 0, err[-3000:]
    assert f"mpilaunch: spare {spare} takes the place of worker {job}-worker-0 (lost)" in err, err[-3000:]
    assert f"started (relaunch) on {job}-worker-0 as attempt 2" in out, out
    assert leftover_objects(kube, job) == []
