"""``--env-archive`` on YARN: mpilaunch's own pieces travel with the job; the archive's python runs them.

A packed environment (venv-pack, conda-pack) brings the user's Python, packages
and MPI into every container (unpacked into ``mpilaunch-env/``); it need not
hold mpilaunch. mpilaunch's pieces come as a second YARN archive: a zip of
this mpilaunch's package (sources only; standard library at run time), built
per job in the run directory and unpacked by YARN into ``mpilaunch-tools/``
next to the environment. Every process of mpilaunch's in a container (the
container entry, the agent, the rank wrapper, the task starter, the launcher
container and the ApplicationMaster's driver) starts as

    "$MPILAUNCH_PYTHON" -I[S] "$MPILAUNCH_TOOLS/run.py" -m mpilaunch.MODULE ARGS...

``run.py`` puts the tools directory first on its *own* ``sys.path`` and runs
the module as ``-m`` would. ``-I`` keeps PYTHONPATH, the user's site
directory and the working directory off that path; ``-S`` (every piece but
the three that need skein) skips site-packages too. The user's program,
started by the rank wrapper, gets the environment as it was: no PYTHONPATH,
no tools directory on its ``sys.path``.

Always with ``--env-archive``, even when the archive has an mpilaunch of its
own: the pieces in the containers are then the version of the command that
submitted the job (the agent's protocol, the key-value keys and the launch
description are no interface between versions), and the archive's copy is
never used.

skein cannot travel this way. The containers talk to skein's
ApplicationMaster over gRPC with mutual TLS (the job secret, the agents'
addresses, the launch description, mpirun's output, the heartbeat), and
skein's client needs grpcio and protobuf built for the archive's python. So
the archive must hold skein. Each container checks first: a runnable
``bin/python``, Python 3.8 or newer, ``import skein``; what is missing is one
line in the container's log (``mpilaunch: --env-archive: ...``, exit 3),
which the submitting side finds and reports (exit 3).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...core import env_names
from ...core.exit_codes import EXIT_ALLOCATION

ENV_DIR = "mpilaunch-env"  # where YARN unpacks --env-archive in each container
TOOLS_DIR = "mpilaunch-tools"  # ... and mpilaunch's pieces
TOOLS_ZIP = "mpilaunch-tools.zip"  # in the run directory
RUNNER = "run.py"
CHECK_MARK = "mpilaunch: --env-archive: "
CHECK_EXIT = EXIT_ALLOCATION  # the container's exit, then mpilaunch's: allocation failed
MIN_PYTHON = (3, 8)
# the pieces that talk to skein's ApplicationMaster: site-packages on, skein checked first
SKEIN_MODULES = (
    "mpilaunch.backends.yarn.in_cluster.container",
    "mpilaunch.backends.yarn.in_cluster.launcher",
    "mpilaunch.backends.yarn.in_cluster.driver",
)
HINT = (
    "pack skein into the environment (pip install skein, and setuptools with Python 3.12 or newer: skein "
    "imports distutils; then venv-pack or conda-pack) and a python "
    f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer at its bin/python; mpilaunch itself need not be in it"
)

# Kept parseable by old pythons: the check in it must get to say what is wrong.
RUN_PY = '''"""mpilaunch's pieces, localized into a YARN container by a job with --env-archive.

    python -I[S] run.py [--require MODULE] -m mpilaunch.MODULE ARGS...   MODULE from this directory
    python -I[S] run.py ARGS...                                          anything else: python ARGS, as is

Only this process gets the directory on sys.path: what it starts gets the
environment as it is. Written by mpilaunch/backends/yarn/tools.py.
"""
import os
import sys

# CONSTANTS


def main():
    args = sys.argv[1:]
    while args[:1] == ["--require"]:
        name, args = args[1], args[2:]
        try:
            __import__(name)
        except Exception as e:
            sys.stderr.write("%sits bin/python (Python %s) cannot import %s: %s: %s; %s\\n" % (
                CHECK_MARK, sys.version.split()[0], name, type(e).__name__,
                str(e).splitlines()[0] if str(e) else "", HINT))
            sys.exit(CHECK_EXIT)
    if len(args) >= 2 and args[0] == "-m" and args[1].split(".")[0] == "mpilaunch":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import runpy

        sys.argv[1:] = args[2:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    os.execv(sys.executable, [sys.executable] + args)


main()
'''


def runner_text() -> str:
    constants = f"CHECK_MARK = {CHECK_MARK!r}\nCHECK_EXIT = {CHECK_EXIT}\nHINT = {HINT!r}"
    return RUN_PY.replace("# CONSTANTS", constants, 1)


# ------------------------------------------------------------------ the submitting side


def tools_zip(rundir: Path) -> Path:
    return Path(rundir) / TOOLS_ZIP


def build(rundir: Path) -> str:
    """The job's copy of mpilaunch's pieces (before the application is submitted: skein uploads it then)."""
    from ...runtime.image_tools import zip_tools

    return zip_tools(str(tools_zip(rundir)), {RUNNER: runner_text()})


def files(archive: str, rundir: Path) -> dict:
    """The skein file resources of every container: the environment and mpilaunch's pieces."""
    import skein

    return {
        ENV_DIR: skein.File(source=os.path.abspath(archive), type="archive"),
        TOOLS_DIR: skein.File(source=os.path.abspath(tools_zip(rundir)), type="archive"),
    }


def service_script(module: str | None) -> str:
    """``/bin/sh`` of a container: the environment's PATH and python, the checks, then ``module``.

    ``None``: the checks only, then hold. A detached job's ApplicationMaster
    runs that as its driver (no reaper: nobody renews a heartbeat), so an
    archive that cannot run mpilaunch's pieces ends the application with
    the finding in the driver's log, as an attached job's does. Without a
    driver, skein would call the application completed once every
    container had failed the check, and nobody could say why.
    """
    env = f'"$PWD/{ENV_DIR}"'
    need = "%d.%d" % MIN_PYTHON
    fail = f">&2; exit {CHECK_EXIT}; fi"
    lines = [
        "set -e",
        f"if [ -f {env}/bin/activate ]; then . {env}/bin/activate; fi",
        f'export PATH={env}/bin:"$PATH"',
        f"export {env_names.PYTHON}={env}/bin/python",
        # the environment check reads a program in it relative to it (rank_env.reported_program)
        f"export {env_names.ENV_DIR}={env}",
        f'export {env_names.TOOLS}="$PWD/{TOOLS_DIR}"',
        f'if [ ! -x "${env_names.PYTHON}" ]; then echo "{CHECK_MARK}it has no runnable bin/python '
        f'(missing, or a link to a python this node lacks); {HINT}" {fail}',
        f'if ! "${env_names.PYTHON}" -S -c "import sys; sys.exit(sys.version_info < {MIN_PYTHON!r})" 2>/dev/null; '
        f'then echo "{CHECK_MARK}its bin/python is $("${env_names.PYTHON}" -V 2>&1 | head -n 1), '
        f'mpilaunch needs Python {need} or newer; {HINT}" {fail}',
    ]
    if module is None:
        lines += [
            f'"${env_names.PYTHON}" -I "${env_names.TOOLS}/{RUNNER}" --require skein -c pass',
            "while :; do sleep 3600; done",
        ]
    else:
        lines.append(f'exec "${env_names.PYTHON}" {" ".join(runner_args(module))}')
    return "\n".join(lines) + "\n"


def runner_args(module: str) -> list[str]:
    """What follows the python in a shell command that starts ``module`` from the tools."""
    if module in SKEIN_MODULES:
        return ["-I", f'"${env_names.TOOLS}/{RUNNER}"', "--require", "skein", "-m", module]
    return ["-IS", f'"${env_names.TOOLS}/{RUNNER}"', "-m", module]


def rank_prefix() -> list[str]:
    """The rank wrapper, from the tools, with the container's python (a path only the container knows).

    Shaped like ``PYTHON -m mpilaunch.rank``: the PS task starter is the same
    prefix with another module, and TensorBoard's ``-m tensorboard.main``
    reaches the environment's python as it is (``run.py``).
    """
    return [
        "/bin/sh",
        "-c",
        f'exec "${env_names.PYTHON}" -IS "${env_names.TOOLS}/{RUNNER}" "$@"',
        "mpilaunch-python",
        "-m",
        "mpilaunch.rank",
    ]


def check_line(text: str | None) -> str | None:
    """The container's finding (``its python ... cannot import skein ...``), if its log holds one."""
    for line in (text or "").splitlines():
        at = line.find(CHECK_MARK)
        if at >= 0:
            return line[at + len("mpilaunch: ") :].replace("; " + HINT, "").strip()
    return None


def _log_text(node_http: str | None, container_id: str | None, log_name: str) -> str | None:
    if not node_http or not container_id:
        return None
    import urllib.request

    url = f"http://{node_http}/ws/v1/node/containerlogs/{container_id}/{log_name}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/plain"}), timeout=5) as r:
            return r.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def container_problem(node_http: str | None, container_id: str | None, service: str) -> str | None:
    """What an ended container's check said (skein writes a service's output to ``<service>.log``)."""
    return check_line(_log_text(node_http, container_id, f"{service}.log"))


def driver_problem(client, report) -> str | None:
    """What the ApplicationMaster's driver's check said, once the application ended because of it.

    The driver starts first, so an archive that cannot run mpilaunch's pieces
    ends the application ("driver failed with exit code 3") before any worker
    runs. Its log is ``application.driver.log`` of the ApplicationMaster's
    container (the first of attempt 1: ``max_attempts`` is 1), on a node of
    the report's host.
    """
    if f"exit code {CHECK_EXIT}" not in (report.diagnostics or ""):
        return None
    container = "container_" + report.id.split("_", 1)[1] + "_01_000001"
    try:
        nodes = [n.http_address for n in client.get_nodes() if n.host == report.host]
    except Exception:
        return None
    for node in nodes[:8]:
        found = check_line(_log_text(node, container, "application.driver.log"))
        if found:
            return found
    return None


# ------------------------------------------------------------------ inside a container


def module_argv(module: str) -> list[str]:
    """How a piece of mpilaunch in a container starts another one (the agent): from the tools when
    the container has them, else as ``python -m``."""
    tools = os.environ.get(env_names.TOOLS)
    if tools:
        return [sys.executable, "-IS", os.path.join(tools, RUNNER), "-m", module]
    return [sys.executable, "-m", module]
