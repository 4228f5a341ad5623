"""No module over 600 lines, in the package and in what the suite and the benchmarks run on.

A module that long holds several responsibilities: it is read, reviewed and
changed as one, and its pieces cannot be tested alone. Split it by what its
parts do (ARCHITECTURE.md, "Where a change goes") rather than raise the limit.
Test modules are not counted: a test file is a list of cases.
"""

from __future__ import annotations

from pathlib import Path

from support.helpers import REPO

MAX_LINES = 600
CHECKED = ("mpilaunch", "testbeds", "benchmarks", "tests/support")


def too_long(root: Path, folders=CHECKED, limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` of each ``.py`` file under ``folders`` of ``root`` longer than ``limit``."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_module_over_600_lines():
    assert all((REPO / folder).is_dir() for folder in CHECKED)  # a renamed folder would pass unseen
    assert too_long(REPO) == []


def test_the_size_check_sees_a_long_module(tmp_path):
    (tmp_path / "mpilaunch" / "deep").mkdir(parents=True)
    (tmp_path / "mpilaunch" / "deep" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "mpilaunch" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(tmp_path, ("mpilaunch",)) == [f"mpilaunch/deep/long.py: {MAX_LINES + 1} lines"]
