"""The repository passes its linter and formatter: ruff check and ruff format --check, with pyproject.toml's [tool.ruff].

An unused import, an undefined name or a noqa that no longer silences anything fails here, in the
suite, rather than waiting for someone to run the linter by hand.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from support.helpers import REPO
from support.mpi_installs import require


def ruff(*args, cwd=REPO):
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        require("ruff is not installed (pip install -e '.[test]')")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    res = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_changes_nothing():
    # one layout for all the code: a diff is about what changed, never about how it was typed
    res = ruff("format", "--no-cache", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_reads_the_projects_rules(tmp_path):
    # the check above is only as good as the configuration it reads: a finding there must fail it
    probe = tmp_path / "probe.py"
    probe.write_text("import os  # noqa\n\n\ndef f():\n    return undefined_name\n")
    res = ruff(
        "check", "--no-cache", "--output-format", "concise", "--config", str(REPO / "pyproject.toml"), str(probe)
    )
    assert res.returncode == 1
    for rule in ("F821", "PGH004"):  # an undefined name; a noqa that names no rule
        assert rule in res.stdout, res.stdout
