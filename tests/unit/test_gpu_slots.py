"""Sizing and GPU mapping (pure functions), and discovery through a stand-in nvidia-smi.

No GPU exists on the test machines: discovery is exercised with a fake
`nvidia-smi` script placed first on PATH (said so here, as the project's
rules ask).
"""

import os

import pytest

from mpilaunch.core import gpu_slots
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import Plan, WorkerPlan


def test_128_gpus_on_8_gpu_nodes_is_16_workers_of_8():
    plan = gpu_slots.plan_job("j", gpus=128, gpus_per_node=8, np=None, slots_per_worker=None)
    assert len(plan.workers) == 16
    assert {w.slots for w in plan.workers} == {8}
    assert {w.gpus for w in plan.workers} == {8}
    assert plan.ranks == 128
    assert plan.workers[0].name == "j-worker-0" and plan.workers[-1].name == "j-worker-15"


def test_fewer_gpus_than_a_node_is_one_worker():
    plan = gpu_slots.plan_job("j", gpus=3, gpus_per_node=8, np=None, slots_per_worker=None)
    assert [(w.slots, w.gpus) for w in plan.workers] == [(3, 3)]


def test_discovered_gpus_per_node_used_when_not_given():
    plan = gpu_slots.plan_job(
        "j", gpus=8, gpus_per_node=None, np=None, slots_per_worker=None, discovered_gpus_per_node=4
    )
    assert [w.gpus for w in plan.workers] == [4, 4]


def test_default_is_8_gpus_per_node():
    plan = gpu_slots.plan_job("j", gpus=16, gpus_per_node=None, np=None, slots_per_worker=None)
    assert len(plan.workers) == 2


def test_non_multiple_names_valid_choices():
    with pytest.raises(UsageError) as e:
        gpu_slots.plan_job("j", gpus=12, gpus_per_node=8, np=None, slots_per_worker=None)
    assert "not a multiple" in e.value.message
    assert "--gpus 8 or --gpus 16" in e.value.hint
    assert "1, 2, 3, 4, 6" in e.value.hint


@pytest.mark.parametrize("gpus", [0, -4])
def test_zero_or_negative_gpus_rejected(gpus):
    with pytest.raises(UsageError, match="at least 1"):
        gpu_slots.plan_job("j", gpus=gpus, gpus_per_node=8, np=None, slots_per_worker=None)


def test_np_spreads_over_ceil_workers():
    plan = gpu_slots.plan_job("j", gpus=None, gpus_per_node=None, np=5, slots_per_worker=2)
    assert [w.slots for w in plan.workers] == [2, 2, 1]
    assert plan.gpus == 0
    assert plan.rank_to_worker() == ["j-worker-0", "j-worker-0", "j-worker-1", "j-worker-1", "j-worker-2"]


def test_np_without_slots_is_one_worker():
    plan = gpu_slots.plan_job("j", gpus=None, gpus_per_node=None, np=4, slots_per_worker=None)
    assert [w.slots for w in plan.workers] == [4]


def test_gpus_and_np_are_exclusive_and_one_is_required():
    with pytest.raises(UsageError, match="mutually exclusive"):
        gpu_slots.plan_job("j", gpus=8, gpus_per_node=None, np=8, slots_per_worker=None)
    with pytest.raises(UsageError, match="how big"):
        gpu_slots.plan_job("j", gpus=None, gpus_per_node=None, np=None, slots_per_worker=None)


def test_partition_gives_each_worker_its_own_devices():
    plan = Plan("j", (WorkerPlan("a", 2, 2), WorkerPlan("b", 2, 2)))
    assert gpu_slots.partition_devices(["0", "1", "2", "3"], plan) == {"a": ["0", "1"], "b": ["2", "3"]}
    with pytest.raises(UsageError, match="needs 4 GPUs but this machine has 3"):
        gpu_slots.partition_devices(["0", "1", "2"], plan)


def test_rank_device_maps_local_rank_to_worker_gpu():
    assert gpu_slots.rank_device(1, ["4", "5"]) == "5"


def test_discovery_through_nvidia_smi(fake_nvidia_smi):
    env = {"PATH": fake_nvidia_smi + os.pathsep + os.environ["PATH"]}
    assert gpu_slots.discover_local_gpus(env) == ["0", "1", "2", "3"]


def test_discovery_honours_cuda_visible_devices(fake_nvidia_smi):
    env = {"PATH": fake_nvidia_smi + os.pathsep + os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "2,3,9"}
    assert gpu_slots.discover_local_gpus(env) == ["2", "3"]
    env["CUDA_VISIBLE_DEVICES"] = ""
    assert gpu_slots.discover_local_gpus(env) == []


def test_no_nvidia_smi_means_no_gpus(tmp_path):
    assert gpu_slots.discover_local_gpus({"PATH": str(tmp_path)}) == []
