"""Every exit status mpilaunch gives is named in mpilaunch/core/exit_codes.py, never a literal.

README's "Exit status" table and the scripts that branch on a status read one file; a literal 2
or 1 in a command's code drifts from it unseen. The check reads the package's syntax trees:
- an exit call with a literal status: ``sys.exit(2)``, ``os._exit(1)``, ``SystemExit(3)``, ``exit(1)``;
- a literal given to an ``exit_code`` (``JobResult(exit_code=1)``, ``result.exit_code = 4``) or to a
  ``code`` that is later exited with (``code = 1`` ... ``os._exit(code)``), tuples unpacked
  (``code, why = 2, "..."``);
- ``return <int>`` (or ``return <int>, ...``) in a function whose return value is an exit status
  by its name: ``main``, ``*_main``, ``cmd_*``, ``run`` (a launcher's), ``run_launcher``,
  ``launcher_exit``.
0 is allowed: success is 0 in every convention, the one value that cannot drift. So are the
conventions of the shell and ssh that the rank wrapper and the rsh shim reproduce for mpirun,
which are its (and a rank's) statuses, not mpilaunch's: 126 cannot execute, 127 not found,
255 ssh could not reach the host (and 128 + N, killed by signal N, which is no literal).
"""

from __future__ import annotations

import ast
import re

from support.helpers import REPO

PACKAGE = REPO / "mpilaunch"
EXIT_CALLS = {"exit", "_exit", "SystemExit", "quit"}
EXIT_STATUS_FUNCTIONS = re.compile(r"main|\w+_main|cmd_\w+|run|run_launcher|launcher_exit")
SHELL_CONVENTIONS = {126, 127, 255}
# a variable that holds the status a command exits with (``code = 1`` ... ``os._exit(code)``)
STATUS_NAMES = {"exit_code", "code"}


def _literal_status(node) -> int | None:
    """The int a status expression is written as (``2``, ``(2, failure)``), None for a name or a computation."""
    if isinstance(node, ast.Tuple) and node.elts:
        node = node.elts[0]
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _assigned(targets, value):
    """(target, value) pairs of an assignment, tuples unpacked: ``code, why = 2, "..."``."""
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            yield from zip(target.elts, value.elts)
        else:
            yield target, value


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def literal_exit_statuses(source: str) -> list[tuple[int, int, str]]:
    """(line, status, what) of each literal exit status in one module's source."""
    found = []

    def note(node, value, what):
        if value is not None and value != 0 and value not in SHELL_CONVENTIONS:
            found.append((node.lineno, value, what))

    def visit(node, function: str | None):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, getattr(child, "name", function))
                continue
            if isinstance(child, ast.Call):
                if _called_name(child) in EXIT_CALLS and child.args:
                    note(child, _literal_status(child.args[0]), f"{_called_name(child)}(...)")
                for keyword in child.keywords:
                    if keyword.arg == "exit_code":
                        note(child, _literal_status(keyword.value), "exit_code=...")
            elif isinstance(child, (ast.Assign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for target, value in _assigned(targets, child.value):
                    name = getattr(target, "attr", getattr(target, "id", None))
                    if name in STATUS_NAMES:
                        note(child, _literal_status(value), f"{name} = ...")
            elif (
                isinstance(child, ast.Return)
                and child.value is not None
                and function is not None
                and EXIT_STATUS_FUNCTIONS.fullmatch(function)
            ):
                note(child, _literal_status(child.value), f"return in {function}()")
            visit(child, function)

    visit(ast.parse(source), None)
    return found


def test_the_check_sees_each_way_of_writing_a_literal_status():
    source = (
        "import os, sys\n"
        "def main():\n    sys.exit(2)\n"
        "def agent_main():\n    return 2\n"
        "def cmd_x():\n    raise SystemExit(3)\n"
        "def run():\n    return 2, 'no mpirun'\n"
        "def f():\n    os._exit(1)\n    r = JobResult(exit_code=1)\n    r.exit_code = 4\n"
        "def g():\n    code = 1\n    os._exit(code)\n"
        "def h():\n    code, why = 3, 'no workers'\n    sys.exit((2, 'usage'))\n"
    )
    assert [line for line, _, _ in literal_exit_statuses(source)] == [3, 5, 7, 9, 11, 12, 13, 15, 18, 19]


def test_the_check_leaves_numbers_that_are_no_exit_status():
    source = (
        "from x import EXIT_USAGE\n"
        "def size():\n    return 1, 8\n"  # a count, in a function that is no command
        "def main():\n    return EXIT_USAGE\n"
        "def cmd_ok():\n    return 0\n"
        "def run():\n    return 127\n"  # sh's "not found", reproduced by the rank wrapper
        "def wrapper():\n    return 128 + signum\n"
        "def g():\n    sys.exit(EXIT_USAGE)\n    JobResult(exit_code=code)\n"
    )
    assert literal_exit_statuses(source) == []


def test_every_exit_status_is_named_in_exit_codes():
    found = [
        f"{path.relative_to(REPO)}:{line}: {what} gives {value}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "exit_codes.py"
        for line, value, what in literal_exit_statuses(path.read_text())
    ]
    assert not found, "use a name from mpilaunch/core/exit_codes.py:\n" + "\n".join(found)
