"""Every run option either reaches a detached launcher unchanged or is refused with --detach.

A detached job is run by the launcher in the cluster from its launch description; an option the
description lacks is silently dropped (--stall-timeout and --on-stall were, on Kubernetes and YARN;
--start-timeout was, on YARN). Each field of the job spec and of every backend's options declares
where it goes (core/declared.py, ``option``); these tests hold every field to its declaration,
through the command line, so a new option cannot be dropped unnoticed.
"""

import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mpilaunch import backends, cli
from mpilaunch.backends.k8s.launch import launch_description as k8s_description
from mpilaunch.backends.launch_description import LaunchDescription
from mpilaunch.backends.yarn.launch import launch_description as yarn_description
from mpilaunch.core.declared import DETACHED
from mpilaunch.core.errors import UsageError
from mpilaunch.core.spec import CARRIED, REFUSED, RESOLVED, SUBMITTING, JobSpec, Plan, PsOptions, WorkerPlan

FIELDS = {f.name: f for f in dataclasses.fields(JobSpec)}

# a value other than the default for every carried field, as a user would give it with --detach
CARRIED_VALUES = {
    "command": ("python3", "train.py", "--epochs", "3"),
    "mpi": "mpich",
    "mpi_args": ("--mca", "btl", "tcp,self"),
    "start_timeout": 77.0,
    "timeout": 3600.0,
    "stall_timeout": 15.0,
    "on_stall": "report",
    "preflight": "enforce",
    "preflight_margin": 0.25,
    "straggler_report": 12.0,
    "bind_gpus": True,
    "verify": False,
    "detach": True,
    "mode": "allreduce",  # the only mode a detached job has (ps is refused)
}

# a value other than the default for every refused field
REFUSED_VALUES = {
    "output_dir": "/tmp/out",
    "output_ranks": (0,),
    "collect": ("results/*.json",),
    "collect_max_bytes": 5 << 30,
    "collect_max_file_bytes": 1 << 20,
    "timeline": "timeline.json",
    "dry_run": True,
    "retries": 2,
    "retry_rank_failures": True,
    "spares": 1,
    "ps": PsOptions(ps=1, workers=2),
}


def kinds(kind: str) -> set[str]:
    return {name for name, f in FIELDS.items() if f.metadata.get("detached") == kind}


def test_detach_option_every_field_declares_where_it_goes():
    undeclared = [
        name for name, f in FIELDS.items() if f.metadata.get("detached") not in (CARRIED, RESOLVED, SUBMITTING, REFUSED)
    ]
    assert undeclared == []
    assert kinds(CARRIED) == set(CARRIED_VALUES), "give a sample value for each carried field"
    assert kinds(REFUSED) == set(REFUSED_VALUES), "give a sample value for each refused field"
    assert all(FIELDS[name].metadata["flag"].startswith("--") for name in kinds(REFUSED))


def detached_spec() -> JobSpec:
    return JobSpec(backend="k8s", name="dj", env=("HF_TOKEN=secret",), mpirun="/opt/mpi/bin/mpirun", **CARRIED_VALUES)


def plan() -> Plan:
    return Plan("dj", (WorkerPlan("dj-worker-0", 2, 0), WorkerPlan("dj-worker-1", 2, 0)))


def through_json(launch: LaunchDescription) -> LaunchDescription:
    return LaunchDescription.from_dict(json.loads(json.dumps(launch.to_dict())))


def yarn_backend(spec: JobSpec) -> SimpleNamespace:
    """What YARN's launch_description reads of its backend (the description is a pure function of it)."""
    return SimpleNamespace(
        spec=spec,
        plan=plan(),
        opts=SimpleNamespace(env_archive=None),
        addresses={"dj-worker-0": "10.0.0.1:4000", "dj-worker-1": "10.0.0.2:4000"},
        rank_prefix=lambda: ["python3", "-m", "mpilaunch.rank"],
        attempt=1,
        status_token="tok",
        exec_context=lambda: {"forward_env": []},
        spares=SimpleNamespace(serving={}),  # --spares: no worker served by a spare
    )


@pytest.mark.parametrize("backend", ["k8s", "yarn"])
def test_detach_option_each_carried_field_reaches_the_launcher_unchanged(backend):
    spec = detached_spec()
    if backend == "k8s":
        made = k8s_description(spec, plan(), "dj", "ns", ["python3", "-m", "mpilaunch.rank"], "tok", {})
    else:
        made = yarn_description(yarn_backend(spec))
    launch = through_json(made)
    launched = launch.job_spec()
    for name in kinds(CARRIED) - {"detach"}:
        assert getattr(launched, name) == getattr(spec, name), name
    assert launch.detach  # the launcher knows it is detached; its own run does not submit again
    assert not launched.detach
    # the resolved ones arrive in the description's own fields
    assert launched.name == launch.job == "dj"
    assert launch.mpirun == "/opt/mpi/bin/mpirun"
    assert "HF_TOKEN=secret" in launched.env  # YARN adds this machine's PYTHONPATH where set (FORWARD_ENV)


def test_detach_option_attached_launcher_leaves_the_timeouts_to_the_submitting_side():
    """Attached, mpilaunch on the submitting side enforces --timeout and --stall-timeout; a launcher
    enforcing them too would race it to the verdict."""
    spec = dataclasses.replace(detached_spec(), detach=False)
    launched = through_json(k8s_description(spec, plan(), "dj", "ns", ["r"], None, {})).job_spec()
    assert (launched.timeout, launched.stall_timeout) == (None, None)
    assert launched.start_timeout == 77.0


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_detach_option_each_refused_field_is_refused_with_its_flag(name):
    values = {"command": ("true",), "backend": "k8s", "detach": True, name: REFUSED_VALUES[name]}
    if name == "retry_rank_failures":
        values["retries"] = 1
    if name == "ps":
        values["mode"] = "ps"
    with pytest.raises(UsageError) as caught:
        JobSpec(**values)
    flag = FIELDS[name].metadata["flag"]
    assert "--detach" in caught.value.message + caught.value.hint
    assert flag.split()[0] in caught.value.message + caught.value.hint or name == "ps"


def test_detach_option_refused_on_the_command_line_in_one_line_exit_2():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "k8s",
            "--detach",
            "--output-dir",
            "/tmp/x",
            "--np",
            "2",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first == (
        "mpilaunch: error: --output-dir needs this mpilaunch to stay until the job ends; --detach leaves at once"
    ), proc.stderr


# ---- through the command line, every option as its declaration says --------------------------------


def as_arguments(name: str, value) -> list[str]:
    """The command-line words that give field ``name`` the value ``value``, from its declaration."""
    flag = FIELDS[name].metadata["flags"][-1]
    if isinstance(value, bool):
        return [flag]  # --bind-gpus; --no-verify for verify=False
    if name == "mpi_args":
        return [flag, " ".join(value)]
    if name == "output_ranks":
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]


def detached_command_line() -> list[str]:
    words = ["--backend", "k8s", "--name", "dj", "--mpirun", "/opt/mpi/bin/mpirun", "-x", "HF_TOKEN=secret"]
    for name in sorted(kinds(CARRIED) - {"command", "mode"}):
        words += as_arguments(name, CARRIED_VALUES[name])
    return [*words, "--", *CARRIED_VALUES["command"]]


@pytest.mark.parametrize("backend", ["k8s", "yarn"])
def test_detach_option_every_carried_option_given_on_the_command_line_reaches_the_launcher(backend):
    """The whole path: parsed from its declared flag, put in the description, through JSON, and
    the launcher's spec holds the value the user typed."""
    argv = detached_command_line()
    argv[1] = backend
    spec, _ = cli.parse_run(argv)
    assert spec.detach
    for name in kinds(CARRIED) - {"detach"}:
        assert getattr(spec, name) == CARRIED_VALUES[name], f"{name} not parsed as given"
    if backend == "k8s":
        made = k8s_description(spec, plan(), "dj", "ns", ["r"], "tok", {})
    else:
        made = yarn_description(yarn_backend(spec))
    launched = through_json(made).job_spec()
    for name in kinds(CARRIED) - {"detach"}:
        assert getattr(launched, name) == CARRIED_VALUES[name], f"{name} did not reach the {backend} launcher"


def refused_command_lines() -> list[tuple[str, list[str]]]:
    """Each refused option as a user gives it, with --detach: the job spec's (the PS options each
    by its own flag) and every backend's."""
    out = []
    for name in sorted(kinds(REFUSED) - {"ps"}):
        words = as_arguments(name, REFUSED_VALUES[name])
        out.append((name, words + (["--retries", "1"] if name == "retry_rank_failures" else [])))
    for ps_field in dataclasses.fields(PsOptions):
        assert ps_field.metadata["detached"] == REFUSED, ps_field.name
        out.append((ps_field.name, [ps_field.metadata["flags"][-1]] + ([] if ps_field.type == "bool" else ["1"])))
    for backend in backends.BUILTIN:
        for f in dataclasses.fields(backends.options_class(backend)):
            if f.metadata["detached"] == REFUSED:  # none today; a new one is held to it here
                out.append((f"{backend}:{f.name}", ["--backend", backend, f.metadata["flags"][-1], "x"]))
    return out


@pytest.mark.parametrize("name, words", refused_command_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_detach_option_each_refused_option_is_refused_on_the_command_line_in_one_line(name, words):
    argv = ["--backend", "k8s", "--detach", "--np", "2", *words, "--", "true"]
    with pytest.raises(UsageError) as caught:
        cli.parse_run(argv)
    error = caught.value
    assert error.exit_code == 2
    assert "\n" not in error.message and "--detach" in error.message + error.hint, error.format()


def test_detach_option_every_backend_option_declares_where_it_goes():
    """Each backend's options are spent on the submitting side (the pods, containers and the
    description's own fields are made from them), or refused; none is carried as it is: a backend
    option declared CARRIED must first get a place in launch_description.carried_spec."""
    for backend in backends.BUILTIN:
        for f in dataclasses.fields(backends.options_class(backend)):
            where = f.metadata.get("detached")
            assert where in DETACHED, f"{backend}'s {f.name} declares no detached= place"
            assert where != CARRIED, f"{backend}'s {f.name}: carry it in launch_description.carried_spec first"
            assert f.metadata["flags"] and f.metadata["help"], f"{backend}'s {f.name}: a flag and help"


def test_detach_option_description_fields_and_carried_options_do_not_share_a_name():
    """The description's JSON is flat (its own fields beside the carried options): one name, one value."""
    own = {f.name for f in dataclasses.fields(LaunchDescription)}
    assert own & kinds(CARRIED) == set()


def test_detach_option_a_refused_backend_option_is_refused_by_its_flag():
    """A backend option declared REFUSED (none of the built-in ones today) is held to it like the
    job spec's: given with --detach, one line naming its flag."""
    from mpilaunch.backends.base import BackendOptions
    from mpilaunch.core.declared import option

    @dataclasses.dataclass(frozen=True)
    class StayingOptions(BackendOptions):
        watch: str | None = option(flag="--watch-here", detached=REFUSED, help="needs this mpilaunch")

    values = {"command": ("true",), "backend": "k8s", "detach": True}
    JobSpec(**values, backend_options=StayingOptions())  # its default: nothing to refuse
    with pytest.raises(UsageError, match="^--watch-here needs this mpilaunch to stay until the job ends"):
        JobSpec(**values, backend_options=StayingOptions(watch="x"))
