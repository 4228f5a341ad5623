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

from __future__ import annotations

import os
import sys

# this file is mpilaunch/core/pylauncher.py: the package's parent is three levels up
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Kernel limit on a "#!" line; longer interpreter paths go through /bin/sh.
SHEBANG_MAX = 127


def run_module_code(module: str, package_parent_expr: str, separator: str = "; ") -> str:
    """Python code that runs ``module.main()`` from the package under ``package_parent_expr`` (a
    Python expression: a path's repr, or ``os.environ[...]`` where the path is known only there)
    and exits with its return value; ``separator`` "; " makes it one line for ``python -c``."""
    return separator.join(
        (
            "import os, sys",
            f"sys.path.insert(0, {package_parent_expr})",
            f"from {module} import main",
            "code = main()",
            "sys.stdout.flush()",
            "sys.stderr.flush()",
            "os._exit(code if isinstance(code, int) else 0)",
        )
    )


def launcher_text(module: str, python: str, package_parent: str = PACKAGE_PARENT) -> str:
    """The script that runs ``module.main()`` and exits with its return value.

    Once ``main`` has returned, the process has nothing left to do: it
    flushes its streams and leaves with ``os._exit``, skipping the
    interpreter's teardown (freeing every module and object: 5-10 ms per
    process here). These processes are on the launch's critical path: each
    rank wrapper's exit is what the MPI daemon waits for, and mpilaunch waits
    for the agents' exit to release the job. None of these modules registers
    atexit work or starts a thread. A ``main`` that raises (``SystemExit``
    included) exits the ordinary way.
    """
    body = run_module_code(module, repr(package_parent), separator="\n") + "\n"
    shebang = f"#!{python} -IS\n"
    # the kernel splits a "#!" line at blanks and ends it at a newline: such paths go through /bin/sh too
    if len(shebang) > SHEBANG_MAX or any(c in python for c in " \t\n"):
        from shlex import quote  # here, not at the top: the shim imports this module on every start

        return f'#!/bin/sh\nexec {quote(python)} -IS -c {quote(body)} "$@"\n'
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
