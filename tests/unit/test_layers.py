"""Import contracts (pyproject.toml [tool.importlinter]) hold, checked by import-linter.

The layers keep the per-rank hot paths stdlib-only and the pure core free of
I/O, so each can be changed and tested on its own.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from support.helpers import REPO


def lint_imports(*args, cwd=REPO):
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, "--no-logo", "--no-cache", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_import_contracts_hold():
    res = lint_imports()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_import_contracts_see_lazy_imports(tmp_path):
    # cli imports the lifecycle only inside a function (lazily): a contract forbidding
    # that must break, or the checks above would miss every lazy import.
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "mpilaunch"\n\n'
        '[[tool.importlinter.contracts]]\nname = "probe"\ntype = "forbidden"\n'
        'source_modules = ["mpilaunch.cli"]\nforbidden_modules = ["mpilaunch.lifecycle"]\n'
    )
    res = lint_imports("--config", str(config))
    assert res.returncode != 0, res.stdout
    assert "mpilaunch.cli -> mpilaunch.lifecycle" in res.stdout
