"""Every MPILAUNCH_* environment variable is named in mpilaunch/core/env_names.py, never a literal.

31 names were written as 60 literals in 28 modules: a typo in one reads as "unset", and two
modules could give one name two meanings unseen. The check reads the package's syntax trees: any
string (f-strings' parts included) holding ``MPILAUNCH_`` outside env_names.py is a literal to
replace with its name from there; docstrings, which explain a variable to a reader, and comments
are left alone. The Kubernetes templates take the names from the same module (``env_names`` in
the templates' globals). tests/, testbeds/ and benchmarks/ set the variables as a user does, and name
their own (MPILAUNCH_CACHE, MPILAUNCH_K8S_TESTBED_DIR, ...): not checked.
"""

from __future__ import annotations

import ast
import re

from mpilaunch.core import env_names
from support.helpers import REPO

PACKAGE = REPO / "mpilaunch"
NAME = re.compile(r"MPILAUNCH_[A-Z0-9_]*")
# Sent as text and run where mpilaunch cannot be imported (python3 -c in a worker, over ssh's
# stdin on a host): they keep their literals, each one a name env_names defines.
STANDALONE = {
    "hang/probe.py": "the stacks probe, run in a worker as python3 -c <its text> (hang/collect.py)",
    "backends/ssh/remote.py": "stage 1 on an ssh host, sent over the session's stdin (ssh/backend.py)",
    "runtime/artifact_probe.py": "--collect's lister and sender, run in a worker as python3 -c <its text>",
    "preflight/link_probe.py": "--preflight's link test, each rank python3 -c <its text> (workloads/preflight_links.py)",
}


def _docstrings(tree) -> set[int]:
    """ids of the string constants that are docstrings or other bare string statements."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def env_name_literals(source: str) -> list[tuple[int, str]]:
    """(line, name) of each MPILAUNCH_* name written in a string of one module's source."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [(node.lineno, name) for name in NAME.findall(node.value)]
    return sorted(found)


def test_the_check_sees_each_way_of_writing_a_name():
    source = (
        '"""Reads $MPILAUNCH_DOC."""\n'  # a docstring: left alone
        "import os\n"
        'A = "MPILAUNCH_A"\n'
        'b = os.environ.get("MPILAUNCH_B")\n'
        'c = f"MPILAUNCH_C={value}"\n'
        'd = "run ${MPILAUNCH_D:-x}"\n'
        'e = {"MPILAUNCH_E": 1}\n'
        'f = ("MPILAUNCH_F", 2)\n'
        "# MPILAUNCH_COMMENT\n"
        "g = env_names.WORKER\n"
    )
    assert [name for _, name in env_name_literals(source)] == [f"MPILAUNCH_{x}" for x in "ABCDEF"]


def test_every_env_name_is_named_in_env_names():
    found = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "env_names.py" and path.relative_to(PACKAGE).as_posix() not in STANDALONE
        for line, name in env_name_literals(path.read_text())
    ]
    assert not found, "use its name from mpilaunch/core/env_names.py:\n" + "\n".join(found)


def test_templates_take_the_names_from_env_names():
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(PACKAGE.rglob("*.j2"))
        for name in NAME.findall(path.read_text())
    ]
    assert not found, "write {{ env_names.NAME }} (in the templates' globals):\n" + "\n".join(found)


def test_env_names_are_distinct_and_prefixed():
    names = {k: v for k, v in vars(env_names).items() if k.isupper()}
    assert all(value == f"MPILAUNCH_{key}" for key, value in names.items()), "the name is the constant, prefixed"


def test_standalone_modules_import_nothing_of_mpilaunch_and_use_known_names():
    """A standalone module that imported env_names would fail where it runs (no mpilaunch there):
    its literals stay, held to the names env_names defines so that a typo still shows."""
    known = {v for k, v in vars(env_names).items() if k.isupper()}
    for rel in STANDALONE:
        tree = ast.parse((PACKAGE / rel).read_text())
        # relative imports anywhere, and mpilaunch at the top: before the zip is on sys.path (remote.py
        # imports from it inside its functions, once unpacked)
        imported = [
            node.module or "."
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and (node.level or (node in tree.body and (node.module or "").startswith("mpilaunch")))
        ]
        assert imported == [], f"{rel} ({STANDALONE[rel]}) imports {imported}"
        unknown = {name for _, name in env_name_literals((PACKAGE / rel).read_text())} - known
        assert unknown == set(), f"{rel}: {sorted(unknown)} not in core/env_names.py"
