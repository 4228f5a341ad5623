"""A Kubernetes job's description at 8192 workers: every object within the API's limits.

A ConfigMap or Secret holds at most 1 MiB of data, and kube-apiserver takes
no object over ~1.5 MiB (etcd's request limit). The root ConfigMap used to
list the workers three times (hostfile, plan.json, launch.json): 1.73 MB at
8192 workers. The launch description and the plan now give the workers as
runs of equal ones; the hostfile is what it is (31 bytes a worker).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from mpilaunch.backends.launch_description import LaunchDescription, LaunchWorker
from support.helpers import REPO

yaml = pytest.importorskip("yaml")

CONFIGMAP_DATA_LIMIT = 1 << 20
OBJECT_LIMIT = 1536 * 1024


def render(*args) -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "render",
            "--backend",
            "k8s",
            "--image",
            "img",
            "--name",
            "big",
            *args,
            "--",
            "python3",
            "train.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in proc.stdout.split("\n---\n") if doc.strip()]


def test_scale_render_8192_workers_keeps_every_object_within_the_api_limits():
    docs = render("--np", "16383", "--slots-per-worker", "2", "--transport", "agent")  # the most workers: 8192
    pods = [d for d in docs if d.lstrip().startswith("apiVersion: v1\nkind: Pod")]
    assert len(pods) == 8192
    others = [yaml.load(d, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) for d in docs if d not in pods]
    others = [d for d in others if d]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in others}
    for (kind, name), obj in by_name.items():
        assert len(json.dumps(obj)) < OBJECT_LIMIT, (kind, name)
        if kind in ("ConfigMap", "Secret"):
            # binaryData counts raw, not as its base64 (kube-apiserver's ValidateConfigMap: len([]byte))
            binary = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
            data = {**(obj.get("data") or {}), **binary, **(obj.get("stringData") or {})}
            assert sum(len(k) + len(v) for k, v in data.items()) < CONFIGMAP_DATA_LIMIT, (kind, name)
    root = by_name[("ConfigMap", "big")]["data"]
    # what the launcher pod reads back is the whole job: 8191 workers of 2 slots and one of 1, by name
    launch = LaunchDescription.from_dict(json.loads(root["launch.json"]))
    assert [w.name for w in launch.workers] == [f"big-worker-{i}" for i in range(8192)]
    assert [w.slots for w in launch.workers] == [2] * 8191 + [1]
    assert len(root["launch.json"]) < 4096 and len(root["plan.json"]) < 1024
    plan = json.loads(root["plan.json"])
    assert (plan["ranks"], plan["worker_runs"]) == (
        16383,
        [{"slots": 2, "gpus": 0, "count": 8191}, {"slots": 1, "gpus": 0, "count": 1}],
    )
    assert root["hostfile"].count("\n") == 8192


def test_launch_description_round_trips_runs_and_irregular_workers():
    regular = LaunchDescription(
        job="j",
        workers=(LaunchWorker("j-worker-0", 8), LaunchWorker("j-worker-1", 8), LaunchWorker("j-worker-2", 3)),
        rank_prefix=("r",),
        spec={"command": ("true",)},
    )
    data = regular.to_dict()
    assert "workers" not in data and data["worker_slots"] == [[8, 2], [3, 1]]
    assert LaunchDescription.from_dict(json.loads(json.dumps(data))) == regular
    # names that are not <job>-worker-<i> in order, or addresses (YARN's agents): listed one by one
    for workers in (
        (LaunchWorker("j-worker-1", 1), LaunchWorker("j-worker-0", 1)),
        (LaunchWorker("j-worker-0", 1, "10.0.0.1:4000"),),
    ):
        odd = LaunchDescription(job="j", workers=workers, rank_prefix=("r",), spec={"command": ("true",)})
        data = odd.to_dict()
        assert "worker_slots" not in data and len(data["workers"]) == len(workers)
        assert LaunchDescription.from_dict(json.loads(json.dumps(data))) == odd


@pytest.mark.parametrize("transport", ["agent", "exec"])
def test_pods_mount_only_immutable_objects_so_no_kubelet_watch_stays(transport):
    """A kubelet watches each Secret and ConfigMap its pods mount for as long as they run, unless the
    object is immutable: with N nodes that was 2N watches in kube-apiserver for the job's life."""
    docs = [
        d
        for d in (yaml.safe_load(t) for t in render("--np", "4", "--slots-per-worker", "2", "--transport", transport))
        if d
    ]
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    pods = [d["spec"] for d in docs if d["kind"] == "Pod"]
    pods += [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"]
    mounted = set()
    for spec in pods:
        for volume in spec.get("volumes") or ():
            if "configMap" in volume:
                mounted.add(("ConfigMap", volume["configMap"]["name"]))
            if "secret" in volume:
                mounted.add(("Secret", volume["secret"]["secretName"]))
    assert mounted and all(objects[key].get("immutable") is True for key in mounted), mounted
    # the launcher reads its description from the job's Secret volume, where its command points
    (launcher,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "big-launcher"]
    container = launcher["spec"]["template"]["spec"]["containers"][0]
    assert "/etc/mpilaunch-secret/description.json" in " ".join(container["command"])
    secret = objects[("Secret", "big-env")]
    assert json.loads(secret["stringData"]["description.json"])["job"] == "big"
