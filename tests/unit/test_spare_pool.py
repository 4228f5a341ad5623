"""--spares' bookkeeping (backends/spare_pool.py) and how a worker served by a spare is told its
name (the shim's remote command): pure functions, no processes."""

from __future__ import annotations

import pytest

from mpilaunch.backends import spare_pool
from mpilaunch.backends.local.backend import LocalBackend
from mpilaunch.backends.ssh import backend as ssh_backend
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import JobSpec, Plan, WorkerPlan
from mpilaunch.rsh_agent import shim


def plan() -> Plan:
    return Plan("j", (WorkerPlan("j-worker-0", 4, 4), WorkerPlan("j-worker-1", 2, 2)))


def test_spare_pool_a_spare_can_take_any_workers_place_and_names_are_never_reused():
    pool = spare_pool.SparePool.for_plan(plan())
    first, second = pool.new_spare(), pool.new_spare()
    assert (first.name, first.slots, first.gpus) == ("j-spare-0", 4, 4)  # the largest worker's
    pool.ready(first.name)
    pool.ready(second.name)
    assert pool.take("j-worker-1", "preflight") == "j-spare-0"  # the oldest waiting
    assert pool.member_of("j-worker-1") == "j-spare-0" and pool.member_of("j-worker-0") == "j-worker-0"
    pool.lost("j-spare-1")  # died waiting
    assert pool.take("j-worker-0", "lost") is None
    assert pool.new_spare().name == "j-spare-2"
    assert pool.to_dict() == {
        "asked": 3,
        "waiting": [],
        "swaps": [{"worker": "j-worker-1", "spare": "j-spare-0", "why": "preflight"}],
    }


def test_spare_shim_tells_the_ranks_the_workers_name_only_where_a_spare_serves_it():
    plain = shim.remote_command("prted --x", "j-worker-1", {"address": "unix:/s"})
    served = shim.remote_command("prted --x", "j-worker-1", {"address": "unix:/s", "spare": "j-spare-0"})
    assert plain == shim.CAPTURE_WORKER_PATH + "prted --x"
    assert served == shim.CAPTURE_WORKER_PATH + "MPILAUNCH_WORKER=j-worker-1; export MPILAUNCH_WORKER; prted --x"
    # a name the shell would read as more than a name is never written into the command
    odd = shim.remote_command("prted", "w;rm -rf x", {"spare": "s"})
    assert odd == shim.CAPTURE_WORKER_PATH + "prted"
    assert shim.SPARE_KEY == spare_pool.SPARE_KEY  # the shim imports nothing heavy: the same key, twice


def test_spare_a_backend_that_keeps_none_refuses_the_option_before_anything_is_made():
    from support.fake_backend import FakeBackend  # the required surface only: no capability

    spec = JobSpec(command=("true",), spares=1, preflight="enforce")
    with pytest.raises(UsageError, match="--spares is not available with the"):
        FakeBackend.check_spec(spec)


def test_spare_yarn_with_the_launcher_container_serves_retries_only():
    from mpilaunch.backends.yarn import spares as yarn_spares

    yarn_spares.check(JobSpec(command=("true",), spares=1, retries=1), "cluster")
    yarn_spares.check(JobSpec(command=("true",), spares=1, preflight="enforce"), "local")
    with pytest.raises(UsageError, match="serves --retries only"):
        yarn_spares.check(JobSpec(command=("true",), spares=1, preflight="enforce"), "cluster")


def test_spare_the_local_and_ssh_backends_accept_the_option():
    LocalBackend.check_spec(JobSpec(command=("true",), spares=2, retries=1))
    assert ssh_backend.SshBackend.capabilities.spares


def test_spare_pod_is_the_workers_manifest_under_its_own_name():
    from mpilaunch.backends.k8s import spares as k8s_spares

    worker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "j-worker-0", "labels": {"mpilaunch/job": "j"}, "ownerReferences": [{"uid": "u"}]},
        "spec": {
            "hostname": "j-worker-0",
            "subdomain": "j",
            "containers": [{"name": "worker", "env": [{"name": "MPILAUNCH_WORKER", "value": "j-worker-0"}]}],
        },
    }
    spare = k8s_spares.renamed(worker, "j-spare-3")
    assert spare["metadata"] == {"name": "j-spare-3", "labels": {"mpilaunch/job": "j"}}  # owner set on create
    assert (spare["spec"]["hostname"], spare["spec"]["subdomain"]) == ("j-spare-3", "j")
    assert spare["spec"]["containers"][0]["env"] == [{"name": "MPILAUNCH_WORKER", "value": "j-spare-3"}]
    assert worker["metadata"]["name"] == "j-worker-0"  # the workers' own manifest untouched


@pytest.mark.parametrize(
    "launcher, retries, gang, queue, account, refused",
    [
        ("local", 1, "none", None, None, None),
        ("local", 0, "none", None, None, None),  # --preflight enforce swaps on this side
        ("cluster", 1, "none", None, None, None),  # the launcher pod swaps a Ready spare in itself
        ("cluster", 0, "none", None, None, None),  # ... for --preflight enforce too
        ("cluster", 1, "none", None, "mpilaunch", "--service-account names no spare pod"),
        # a gang: spares outside its minimum, asked for once the workers are placed (after_the_gang)
        ("local", 1, "volcano", None, None, None),
        ("local", 1, "none", "team-a", None, "--spares cannot be used with --queue"),
    ],
)
def test_spare_pods_are_kept_where_this_side_can_swap_and_no_fixed_group_counts_pods(
    launcher, retries, gang, queue, account, refused
):
    from mpilaunch.backends.k8s import launcher_placement
    from mpilaunch.backends.k8s import spares as k8s_spares
    from mpilaunch.backends.k8s.options import K8sOptions

    spec = JobSpec(command=("true",), spares=1, retries=retries, preflight="enforce")
    opts = K8sOptions(gang=gang, queue=queue, service_account=account)
    check = lambda: k8s_spares.check(spec, launcher_placement.for_launcher(launcher), opts)  # noqa: E731
    if refused is None:
        check()
    else:
        with pytest.raises(UsageError, match=refused):
            check()


def test_spare_pods_a_launcher_pod_may_be_told_of_are_named_in_its_role_and_its_env():
    from types import SimpleNamespace

    from mpilaunch.backends.k8s import launcher_placement
    from mpilaunch.backends.k8s import spares as k8s_spares
    from mpilaunch.backends.k8s.in_cluster.launcher import serving_of

    backend = SimpleNamespace(
        spec=JobSpec(command=("true",), spares=2, retries=2),
        launcher_placement=launcher_placement.for_launcher("cluster"),
        job="j",
        spares=spare_pool.SparePool.for_plan(plan()),
    )
    # each relaunch may take the 2 waiting spares and ask for 2 more: 2 x (1 + 2) names
    assert backend.launcher_placement.spare_names_for_role(backend) == [f"j-spare-{i}" for i in range(6)]
    assert k8s_spares.serving_env(backend) == []
    backend.spares.serving["j-worker-1"] = "j-spare-0"
    (env,) = k8s_spares.serving_env(backend)
    assert serving_of({env["name"]: env["value"]}) == {"j-worker-1": "j-spare-0"}
    assert serving_of({"MPILAUNCH_SERVING": "not json"}) == {} and serving_of({}) == {}
    backend.launcher_placement = launcher_placement.for_launcher("local")
    assert backend.launcher_placement.spare_names_for_role(backend) == []  # no launcher pod, no Role to name them in


def test_spare_pool_hands_out_given_names_in_order_and_none_once_they_ran_out():
    pool = spare_pool.SparePool.for_plan(plan(), names=["node-3", "node-4"])
    first = pool.new_spare()
    assert (first.name, first.slots, first.gpus) == ("node-3", 4, 4)
    assert pool.new_spare().name == "node-4"
    assert pool.new_spare() is None and pool.asked == 2


def test_spare_ssh_spares_are_the_hostfiles_hosts_after_the_plans():
    hosts = [("node-1", 2), ("node-2", 2), ("node-3", 1), ("node-4", 8)]
    assert ssh_backend.hosts_after_plan(hosts, 2) == ["node-3", "node-4"]
    assert ssh_backend.hosts_after_plan(hosts, 4) == []
    enough = JobSpec(command=("true",), np=4, spares=2, retries=1, hostfile="hosts")
    assert ssh_backend.too_few_spare_hosts(enough, 2, ["node-3", "node-4"]) is None


def test_spare_ssh_too_few_hosts_left_is_one_line_with_what_to_change():
    spec = JobSpec(command=("true",), np=4, spares=3, retries=1, hostfile="hosts")
    refused = ssh_backend.too_few_spare_hosts(spec, 2, ["node-3"])
    assert str(refused) == (
        "--spares 3 needs 3 hosts of --hostfile beyond the 2 the job takes for --np 4, and hosts has 1 more"
    )
    assert (
        refused.hint
        == "add hosts to the hostfile (a spare is the next host after the job's), lower --np, or give --spares 1"
    )
    assert refused.exit_code == 2
