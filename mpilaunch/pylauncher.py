"""Per-job executables that start one of mpilaunch's hot-path modules with ``python -IS``.

The shim (once per worker), the rank wrapper (once per rank) and the local
agents start many times per job. ``-S`` skips ``site``: site-packages
``.pth`` files cost tens of milliseconds per start on a typical machine (one
of this machine's imports certifi), and the editable install's finder more.
``-I`` keeps the user's PYTHONPATH and the script's directory off
``sys.path``. The package directory is put on ``sys.path`` explicitly
instead. Only the started interpreter is isolated: the programs it starts
get the environment unchanged.

Standard library only (imported by the shim's module).
"""

import os
import sys

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Kernel limit on a "#!" line; longer interpreter paths go through /bin/sh.
SHEBANG_MAX = 127


def launcher_text(module: str, python: str, package_parent: str = PACKAGE_PARENT) -> str:
    """The script that runs ``module.main()`` and exits with its return value."""
    body = (
        "import sys\n"
        f"sys.path.insert(0, {package_parent!r})\n"
        f"from {module} import main\n"
        "sys.exit(main())\n"
    )
    shebang = f"#!{python} -IS\n"
    if len(shebang) > SHEBANG_MAX or " " in python:
        body_lit = body.replace("'", "'\"'\"'")
        return f"#!/bin/sh\nexec '{python}' -IS -c '{body_lit}' \"$@\"\n"
    return shebang + body


def write_launcher(path: str, module: str, python: str | None = None) -> str:
    """Write the executable at ``path`` atomically (mpirun may already be reading the directory)."""
    text = launcher_text(module, python or sys.executable)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path
