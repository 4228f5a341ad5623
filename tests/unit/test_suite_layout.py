"""The suite's own layout (tests/conftest.py says what goes where).

Test modules live under ``tests/unit``, ``tests/lifecycle`` or ``tests/e2e``;
what they share is in ``tests/support``. No module imports a test module or a
conftest (``from conftest import ...`` runs that conftest a second time, under
another name, and a fixture imported from a test module is a second fixture,
one more testbed): checked on every ``.py`` file under tests/ with ``ast``,
lazy imports inside functions included. Basenames stay unique: pytest's
default import mode imports each test module by its basename.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_FOLDERS = ("unit", "lifecycle", "e2e")


def forbidden(module: str) -> bool:
    """A test module, a conftest, or a top-level ``helpers`` module (shared code is ``support.helpers``)."""
    parts = module.split(".")
    return parts[0] == "helpers" or any(p == "conftest" or p.startswith("test_") for p in parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth; ``from . import x`` as ``x``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                found.append((node.lineno, node.module))
            if node.level or not node.module:  # relative: the names may be modules themselves
                prefix = f"{node.module}." if node.module else ""
                found += [(node.lineno, prefix + alias.name) for alias in node.names]
    return found


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_forbidden_is_what_the_rule_names():
    for module in ("conftest", "helpers", "helpers.x", "test_k8s", "e2e.k8s.test_k8s", "e2e.conftest"):
        assert forbidden(module), module
    for module in ("support.helpers", "support.k8s", "mpilaunch.backends", "testbeds.k8s.cluster", "pytest"):
        assert not forbidden(module), module


def test_imports_of_sees_lazy_and_relative_imports(tmp_path):
    source = tmp_path / "test_x.py"
    source.write_text(
        "import os\ndef f():\n    from test_other import thing\n    from . import conftest\n    import helpers\n"
    )
    assert [m for _, m in imports_of(source) if forbidden(m)] == ["test_other", "conftest", "helpers"]


def test_no_module_imports_a_test_module_or_a_conftest():
    offenders = [
        f"{path.relative_to(TESTS)}:{line}: imports {module}"
        for path in python_files()
        for line, module in imports_of(path)
        if forbidden(module)
    ]
    assert offenders == [], "shared code belongs in tests/support:\n" + "\n".join(offenders)


def test_test_modules_sit_under_unit_lifecycle_or_e2e():
    misplaced = [
        str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] not in TEST_FOLDERS
    ]
    assert misplaced == [], f"test modules outside tests/{{{','.join(TEST_FOLDERS)}}}: {misplaced}"


def test_test_module_basenames_are_unique():
    where = defaultdict(list)
    for p in TESTS.rglob("test_*.py"):
        where[p.name].append(str(p.relative_to(TESTS)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
