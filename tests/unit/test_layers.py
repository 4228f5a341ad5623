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
    return subprocess.run([exe, "--no-logo", "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


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
        'source_modules = ["mpilaunch.cli"]\nforbidden_modules = ["mpilaunch.job.lifecycle"]\n'
    )
    res = lint_imports("--config", str(config))
    assert res.returncode != 0, res.stdout
    assert "mpilaunch.cli -> mpilaunch.job.lifecycle" in res.stdout


def _contracts() -> dict[str, dict]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return {contract["id"]: contract for contract in config}


def _builtin_backend_modules() -> list[tuple[str, str, str]]:
    """(name, its folder's package, its backend module) of each registered backend that lives in
    mpilaunch (the contracts cover the mpilaunch package only; a third-party backend is its own)."""
    from mpilaunch import backends

    found = []
    for name in backends.registered():
        module = backends.options_class(name).backend_class.partition(":")[0]
        if module.startswith("mpilaunch."):
            found.append((name, module.rpartition(".")[0], module))
    return found


def test_every_registered_backend_is_in_the_import_contracts():
    # A backend added to the registry (backends/__init__.py) must also be added to the contracts
    # that name backends one by one, or its folder escapes them unnoticed (ssh did, for a while).
    from importlib.util import find_spec

    contracts = _contracts()
    assert len(_builtin_backend_modules()) >= 4  # local, k8s, yarn, ssh: the registry was read
    missing = []
    for name, folder, module in _builtin_backend_modules():
        wanted = [
            ("backends-independent", "modules", folder),
            ("hot-paths-stdlib", "forbidden_modules", module),
            ("launchers-are-entry-points", "source_modules", module),
        ]
        if find_spec(f"{folder}.in_cluster") is not None:  # what runs in its cluster: the submitting side imports none
            wanted.append(("launchers-are-entry-points", "forbidden_modules", f"{folder}.in_cluster"))
        missing += [
            f"{contract}.{key} lacks {entry!r} (backend {name})"
            for contract, key, entry in wanted
            if entry not in contracts[contract][key]
        ]
    assert not missing, "pyproject.toml [tool.importlinter]: " + "; ".join(missing)
