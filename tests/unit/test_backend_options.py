"""A backend's options are declared by the backend (backends/<name>/options.py) and reach it in the
job's spec (``JobSpec.backend_options``): what a user gives on the command line is what the backend
gets, whichever parser (the chosen backend's alone, or every backend's) read it."""

import argparse

import pytest

from mpilaunch import backends, cli
from mpilaunch.core.errors import UsageError

COMMAND = ["--np", "2", "--", "true"]


@pytest.mark.parametrize("name", list(backends.BUILTIN))
def test_no_options_given_is_the_options_defaults(name):
    # each default is written twice (the field and its add_argument): they must agree
    options = backends.options_class(name)
    args = cli.build_parser(backend_names=(name,)).parse_args(["--backend", name])
    assert options.from_args(args) == options()


@pytest.mark.parametrize("backend, queue", [("yarn", "root.team-a"), ("k8s", "team-a")])
def test_queue_reaches_the_backend_through_the_spec(backend, queue):
    # --queue is yarn's and k8s's, each its own meaning; the chosen backend's parser reads it ...
    spec, _ = cli.parse_run(["--backend", backend, "--queue", queue, *COMMAND])
    assert spec.backend_options.queue == queue
    # ... and so does the parser of every backend, where the two declarations are one option
    spec, _ = cli.parse_run(["--backend", backend, "--queue", queue, "--ssh-command", "ssh", *COMMAND])
    assert spec.backend_options.queue == queue


def test_a_backend_option_is_a_field_and_its_argument():
    # the default from_args: a field takes the option of its name, a repeated option as a tuple
    spec, _ = cli.parse_run(
        ["--backend", "yarn", "--node-label", "gpu", "--vcores", "4", "--memory", "8 GiB", *COMMAND]
    )
    options = spec.backend_options
    assert (options.node_label, options.vcores, options.memory, options.queue) == ("gpu", 4, "8 GiB", None)


def test_an_option_invalid_for_its_backend_is_refused():
    with pytest.raises(UsageError, match="invalid --queue 'Team_A'"):
        cli.parse_run(["--backend", "k8s", "--image", "x", "--queue", "Team_A", *COMMAND])


def test_a_shared_option_must_parse_alike_in_every_backend():
    parser = argparse.ArgumentParser()
    cli.BackendGroup(parser, parser.add_argument_group("a"), "a").add_argument("--queue", help="a's")
    second = cli.BackendGroup(parser, parser.add_argument_group("b"), "b")
    second.add_argument("--queue", help="b's")
    assert parser.parse_args(["--queue", "q"]).queue == "q" and "a's; --backend b: b's" in parser.format_help()
    with pytest.raises(ValueError, match="the b backend declares --queue unlike another backend"):
        second.add_argument("--queue", type=int)


def test_every_run_option_has_help():
    """Each option is declared once, with its help (docs/usage.md's tables are made from it): none
    shows in --help as a bare flag."""
    bare = [
        action.option_strings[-1]
        for action in cli.build_parser()._actions
        if action.option_strings and not (action.help or "").strip()
    ]
    assert bare == []


def test_an_option_declared_once_is_parsed_and_built_from_its_declaration():
    """The parser's arguments and the spec come from the same declarations (core/declared.py):
    every field of the spec, the PS options and each backend's options has its argument, by name."""
    import dataclasses

    from mpilaunch.core import declared
    from mpilaunch.core.spec import JobSpec

    parser = cli.build_parser()
    dests = {action.dest for action in parser._actions}
    for cls in (JobSpec, *(backends.options_class(name) for name in backends.BUILTIN)):
        for f in declared.declared(cls):
            assert f.name in dests, f"{cls.__name__}.{f.name} has no argument"
    given = {f.name for f in dataclasses.fields(JobSpec) if not f.metadata["flags"]}
    assert given == {"command", "ps", "backend_options"}  # after '--', the nested PS options, the backend's


@pytest.mark.parametrize(
    "words, mode",
    [
        (["-r", "ps:1,worker:2"], "ps"),
        (["--workers", "2"], "ps"),
        (["--chief"], "ps"),
        (["-i", "/data"], "allreduce"),  # a path alone sizes no task: as before the declarations
        (["--mode", "allreduce", "--ps", "1"], "allreduce"),
        ([], "allreduce"),
    ],
)
def test_mode_is_implied_by_the_options_that_size_ps_tasks(words, mode):
    spec, _ = cli.parse_run([*words, "--", "true"])
    assert spec.mode == mode
