"""PS mode, pure functions: cluster requirements, task list, ClusterSpec, TF_CONFIG, DTF_* env."""

import json

import pytest

from mpilaunch.core import clusterspec as cs
from mpilaunch.core.clusterspec import Task
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import PsOptions
from mpilaunch.task_starter import expand_task_variables, task_argv

# ------------------------------------------------------------------ -r "ps:2,worker:4"


def test_parse_requirement_keeps_order_and_tolerates_spaces():
    assert cs.parse_requirement("ps:2,worker:4") == (("ps", 2), ("worker", 4))
    assert cs.parse_requirement(" worker : 1 , ps:1 ") == (("worker", 1), ("ps", 1))
    assert cs.parse_requirement("my_job:3") == (("my_job", 3),)


@pytest.mark.parametrize(
    "text, message",
    [
        ("ps:x", "must be a whole number, got 'x'"),
        ("worker:0", "needs at least 1 task"),
        ("ps:1,ps:2", "appears twice"),
        ("ps:-1", "must be a whole number"),
        ("ps", "bad cluster requirement 'ps'"),
        (":2", "bad cluster requirement"),
        ("", "empty cluster requirement"),
        ("ps:1,", "bad cluster requirement ''"),
        ("PS:1", "bad job name 'PS'"),
        ("work-er:1", "bad job name"),
        ("tensorboard:1", "not a job of the TensorFlow cluster"),
    ],
)
def test_bad_requirements_are_usage_errors_with_a_hint(text, message):
    with pytest.raises(UsageError) as err:
        cs.parse_requirement(text)
    assert message in err.value.message
    assert err.value.hint and err.value.exit_code == 2


def test_requirements_from_flags_order_chief_worker_ps_evaluator():
    jobs = cs.requirements_from_options(PsOptions(ps=2, workers=4, chief=True, evaluator=True))
    assert jobs == (("chief", 1), ("worker", 4), ("ps", 2), ("evaluator", 1))


def test_requirement_form_combines_with_chief_flag():
    jobs = cs.requirements_from_options(PsOptions(requirement="worker:2,ps:1", chief=True))
    assert jobs == (("chief", 1), ("worker", 2), ("ps", 1))


@pytest.mark.parametrize(
    "options, message",
    [
        (PsOptions(requirement="ps:1,worker:1", ps=1), "both size the job"),
        (PsOptions(requirement="chief:1,worker:1", chief=True), "both ask for the chief"),
        (PsOptions(requirement="chief:2,worker:1"), "one chief task"),
        (PsOptions(requirement="evaluator:2,worker:1"), "one evaluator task"),
        (PsOptions(ps=2), "no chief and no worker"),
        (PsOptions(), "needs tasks to run"),
        (PsOptions(ps=-1, workers=1), "--ps must not be negative"),
        (PsOptions(workers=2, tensorboard=True), "--tensorboard needs an output directory"),
    ],
)
def test_bad_option_combinations(options, message):
    with pytest.raises(UsageError) as err:
        cs.requirements_from_options(options)
    assert message in err.value.message and err.value.hint


# ------------------------------------------------------------------ tasks


def test_task_list_names_and_tensorboard_outside_the_cluster():
    tasks = cs.task_list((("chief", 1), ("worker", 2), ("ps", 1)), tensorboard=True)
    assert [t.id for t in tasks] == ["chief:0", "worker:0", "worker:1", "ps:0", "tensorboard:0"]
    assert [t.in_cluster for t in tasks] == [True, True, True, True, False]
    assert Task("worker", 1).worker_name("job") == "job-worker-1"
    assert Task("my_job", 0).worker_name("job") == "job-my-job-0"  # valid Kubernetes name
    assert Task("ps", 3).log_name() == "ps-3.log"


def test_decisive_tasks_chief_else_all_workers():
    with_chief = cs.task_list((("chief", 1), ("worker", 2), ("ps", 1)))
    assert cs.decisive_tasks(with_chief) == (Task("chief", 0),)
    without = cs.task_list((("worker", 2), ("ps", 1), ("evaluator", 1)))
    assert cs.decisive_tasks(without) == (Task("worker", 0), Task("worker", 1))
    assert not cs.fails_job(Task("tensorboard", 0)) and cs.fails_job(Task("ps", 0))


# ------------------------------------------------------------------ what a task is told


def _cluster():
    tasks = cs.task_list((("chief", 1), ("worker", 2), ("ps", 2)), tensorboard=True)
    addresses = {t: f"10.0.0.{n}:{2000 + n}" for n, t in enumerate(tasks)}
    return tasks, cs.cluster_spec(tasks, addresses)


def test_cluster_spec_lists_each_job_in_index_order_without_tensorboard():
    _, cluster = _cluster()
    assert cluster == {
        "chief": ["10.0.0.0:2000"],
        "worker": ["10.0.0.1:2001", "10.0.0.2:2002"],
        "ps": ["10.0.0.3:2003", "10.0.0.4:2004"],
    }


def test_task_environment_has_tf_config_dtf_and_360_variables():
    _, cluster = _cluster()
    options = PsOptions(ps=2, workers=2, chief=True, input_path="hdfs://in", output_path="/out")
    env = cs.task_environment(cluster, Task("worker", 1), options, script_path="/tmp/x/train.py")
    assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": "worker", "index": 1}}
    assert env["DTF_PS_HOSTS"] == "10.0.0.3:2003,10.0.0.4:2004"
    assert env["DTF_WORKER_HOSTS"] == "10.0.0.1:2001,10.0.0.2:2002"
    assert env["DTF_CHIEF_HOSTS"] == "10.0.0.0:2000"
    assert (env["DTF_TASK_JOB_NAME"], env["DTF_TASK_INDEX"]) == ("worker", "1")
    assert (env["DTF_INPUT_PATH"], env["DTF_OUTPUT_PATH"]) == ("hdfs://in", "/out")
    assert env["DTF_TASK_SCRIPT"] == "/tmp/x/train.py"
    assert json.loads(env["TF_CLUSTER_DEF"]) == cluster
    assert (env["TF_ROLE"], env["TF_INDEX"]) == ("worker", "1")
    assert all(isinstance(v, str) for v in env.values())


def test_optional_paths_absent_and_tensorboard_gets_no_tf_config():
    _, cluster = _cluster()
    env = cs.task_environment(cluster, Task("ps", 0), PsOptions(ps=2, workers=2))
    assert "DTF_INPUT_PATH" not in env and "DTF_OUTPUT_PATH" not in env and "DTF_TASK_SCRIPT" not in env
    board = cs.task_environment(cluster, Task("tensorboard", 0), PsOptions(output_path="/out"))
    assert "TF_CONFIG" not in board and "TF_ROLE" not in board
    assert board["DTF_OUTPUT_PATH"] == "/out" and board["DTF_PS_HOSTS"]


def test_placeholder_addresses_name_the_container():
    tasks = cs.task_list((("worker", 1), ("ps", 1)))
    cluster = cs.cluster_spec(tasks, cs.placeholder_addresses(tasks, "demo"))
    assert cluster == {"worker": ["demo-worker-0:PORT"], "ps": ["demo-ps-0:PORT"]}


# ------------------------------------------------------------------ task starter, pure part


def test_task_variables_expand_in_argv_words_only_for_provided_names():
    provided = {"DTF_TASK_JOB_NAME": "ps", "DTF_TASK_SCRIPT": "/t/train.py"}
    assert expand_task_variables("--job_name=${DTF_TASK_JOB_NAME}", provided) == "--job_name=ps"
    assert expand_task_variables("$DTF_TASK_SCRIPT", provided) == "/t/train.py"
    assert expand_task_variables("$HOME/${NOPE}", provided) == "$HOME/${NOPE}"
    assert task_argv(["python", "${DTF_TASK_SCRIPT}", "a b"], provided) == ["python", "/t/train.py", "a b"]


def test_single_word_command_is_a_shell_command_line():
    assert task_argv(["python x.py --i $DTF_TASK_INDEX"], {}) == ["/bin/sh", "-c", "python x.py --i $DTF_TASK_INDEX"]
