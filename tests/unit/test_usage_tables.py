"""docs/usage.md's option tables are the parser's own (scripts/usage_tables.py).

The tables are generated from ``mpilaunch.cli.build_parser()`` at run time and
committed; this test regenerates them and fails when the page differs, so an
option added (or its help changed) without ``python scripts/usage_tables.py
--write`` fails the suite, and so does a backend whose options have no place
on the page.
"""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from support.helpers import REPO


def load_generator():
    spec = importlib.util.spec_from_file_location("usage_tables", REPO / "scripts" / "usage_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def test_usage_tables_match_the_parser():
    page = gen.USAGE.read_text()
    assert gen.render(page, gen.current_tables()) == page, (
        "docs/usage.md's option tables differ from mpilaunch's parser: run python scripts/usage_tables.py --write"
    )


def test_usage_tables_list_every_option_of_the_parser():
    """Every option --help shows is in a table, backends' included (what the check above guards)."""
    from mpilaunch import backends, cli

    page = gen.USAGE.read_text()
    for name in (None, *backends.BUILTIN):
        parser = cli.build_parser(backend_names=None if name is None else (name,))
        for action in parser._actions:
            if gen.shown(action):
                assert f"| {gen.code(gen.invocation(action))} |" in page, action.option_strings


def with_extra_option(build_parser, flag: str, group_title: str | None = None):
    """build_parser, with one more option in the group titled ``group_title`` (or in a group of
    its own, as a backend's would be)."""

    def build(**kwargs):
        parser = build_parser(**kwargs)
        group = next((g for g in parser._action_groups if g.title == group_title), None)
        (group or parser.add_argument_group("--backend extra")).add_argument(flag, help="an option nobody documented")
        return parser

    return build


def test_usage_tables_new_option_without_docs_fails():
    """An option added to the parser but not to the page: the page no longer matches."""
    from mpilaunch import backends, cli

    page = gen.USAGE.read_text()
    tables = gen.option_tables(
        with_extra_option(cli.build_parser, "--brand-new", "job control"), tuple(backends.BUILTIN)
    )
    assert "--brand-new" in tables["job-control"]
    assert gen.render(page, tables) != page


def test_usage_tables_backend_without_a_place_is_an_error():
    """A backend (an installed package's, or a new built-in one) whose options have no marker."""
    from mpilaunch import backends, cli

    tables = gen.option_tables(cli.build_parser, tuple(backends.BUILTIN))
    tables["backend-slurm"] = "| option | default | meaning |"
    with pytest.raises(ValueError, match="no place for the option table.*backend-slurm"):
        gen.render(gen.USAGE.read_text(), tables)


def test_usage_tables_marker_without_a_group_is_an_error():
    from mpilaunch import backends, cli

    tables = gen.option_tables(cli.build_parser, tuple(backends.BUILTIN))
    page = gen.USAGE.read_text() + "\n<!-- options: gone -->\n<!-- end options -->\n"
    with pytest.raises(ValueError, match="'gone'"):
        gen.render(page, tables)


def test_usage_tables_cells_are_one_line_of_escaped_text():
    assert gen.cell("UID[:GID]|image|root") == "UID[:GID]\\|image\\|root"
    assert gen.code("--run-as-user UID[:GID]|image|root") == "`--run-as-user UID[:GID]`\\|`image`\\|`root`"
    assert gen.cell("NCCL_*  and\n <i>") == "NCCL_\\* and &lt;i&gt;"


def test_usage_tables_invocation_and_default():
    p = argparse.ArgumentParser()
    flag = p.add_argument("--bind", action="store_true")
    choice = p.add_argument("--mode", choices=("a", "b"), default="a")
    named = p.add_argument("-r", "--req", dest="requirement", default=2.0)
    assert (gen.invocation(flag), gen.default_of(flag)) == ("--bind", "")
    assert (gen.invocation(choice), gen.default_of(choice)) == ("--mode {a,b}", "`a`")
    assert (gen.invocation(named), gen.default_of(named)) == ("-r, --req REQUIREMENT", "`2`")
