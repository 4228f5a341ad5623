"""Which MPI an mpirun is: its ``--version`` read by each flavour, the search along PATH.

:func:`detect` and :func:`find_mpirun` run ``mpirun --version`` (remembered
per binary: ``versions.py``); the rest is pure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from ..errors import UsageError
from . import versions
from .base import MpiInfo
from .registry import FLAVOURS, described, detection_order, for_name

# What --mpi auto looks for on PATH; a named flavour has its own list (MpiFlavour.executables).
AUTO_EXECUTABLES = ("mpirun", "mpiexec")


def parse_version_output(text: str) -> tuple[str, str] | None:
    """``mpirun --version`` output -> (flavour, version), or None if unknown."""
    for flavour in detection_order():
        version = flavour.parse_version(text)
        if version is not None:
            return flavour.name, version
    return None


def first_line(text: str, limit: int = 80) -> str:
    """What an unrecognised --version printed, for the error message."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return "nothing"
    return repr(line if len(line) <= limit else line[:limit] + "...")


def unknown_mpi_error(path: str, text: str) -> UsageError:
    return UsageError(
        f"cannot tell which MPI {path} is: its --version printed {first_line(text)}",
        f"mpilaunch knows {described()}: pass --mpi {'|'.join(FLAVOURS)} to say which one "
        "it is, or point --mpirun at another mpirun",
    )


def _version_text(path: str) -> str:
    # Intel's mpirun is a script that runs "mpiexec.hydra" from PATH: give it its own directory.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(path), env.get("PATH", "")])
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, env=env)
    except OSError as e:
        raise UsageError(f"cannot run {path}: {e.strerror or e}", "check --mpirun or your PATH") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{path} --version did not answer in 30 s", "check the MPI installation") from None
    return proc.stdout + proc.stderr


def detect(path: str, flavour: str = "auto") -> MpiInfo:
    """The MPI behind ``path``; an explicit ``flavour`` is trusted when --version says nothing known."""
    text = versions.remembered(path)
    if text is None or parse_version_output(text) is None:
        text = _version_text(path)
        if parse_version_output(text) is not None:
            versions.remember(path, text)
    parsed = parse_version_output(text)
    if parsed is None:
        if flavour != "auto":
            return MpiInfo(flavour=flavour, version="unknown", path=path)
        raise unknown_mpi_error(path, text)
    return MpiInfo(flavour=parsed[0], version=parsed[1], path=for_name(parsed[0]).resolve_path(path))


def search_path(path_env: str | None) -> str:
    """PATH, then this Python's scripts directory: ``pip install mpilaunch[mpi]``
    puts Open MPI's mpirun there, which is not always on PATH (pyenv, venvs)."""
    path = path_env if path_env is not None else os.environ.get("PATH", "")
    return os.pathsep.join(p for p in (path, scripts_dir()) if p)


def scripts_dir() -> str:
    """Where this Python's installs put executables (``sysconfig.get_path("scripts")``)."""
    if sys.prefix != sys.base_prefix:  # a venv: <venv>/bin (sysconfig's venv scheme), no sysconfig import (~1 ms)
        return os.path.join(sys.prefix, "bin")
    import sysconfig

    return sysconfig.get_path("scripts")


def candidates(names, path_env: str, every_dir: bool) -> list[str]:
    """Executables to try, in PATH order. ``every_dir``: not only the first of each name
    (``--mpi intel`` must find Intel's mpiexec.hydra behind MPICH's on PATH)."""
    if not every_dir:
        return [found for found in (shutil.which(n, path=path_env) for n in names) if found]
    out = []
    for name in names:
        for directory in path_env.split(os.pathsep):
            path = os.path.join(directory, name)
            if directory and os.path.isfile(path) and os.access(path, os.X_OK):
                out.append(path)
    return out


def find_mpirun(flavour: str, explicit: str | None, path_env: str | None = None) -> MpiInfo:
    path_env = search_path(path_env)
    if explicit:
        resolved = shutil.which(explicit, path=path_env) if os.sep not in explicit else explicit
        if not resolved or not os.access(resolved, os.X_OK):
            raise UsageError(f"--mpirun {explicit} not found or not executable", "give the full path to mpirun")
        info = detect(resolved, flavour)
        if flavour != "auto" and info.flavour != flavour:
            raise UsageError(
                f"--mpirun {explicit} is {info.flavour} {info.version}, not {flavour}",
                f"use --mpi {info.flavour} or point --mpirun at a {flavour} mpirun",
            )
        return info
    seen = []
    unknown: list[UsageError] = []
    names = AUTO_EXECUTABLES if flavour == "auto" else for_name(flavour).executables
    for resolved in candidates(names, path_env, every_dir=flavour != "auto"):
        if os.path.realpath(resolved) in seen:
            continue
        seen.append(os.path.realpath(resolved))
        try:
            info = detect(resolved)
        except UsageError as e:
            unknown.append(e)
            continue
        if flavour in ("auto", info.flavour):
            return info
    if flavour == "auto" and unknown:
        raise unknown[0]  # found one, but cannot tell what it is: say what it printed
    wanted = "an mpirun" if flavour == "auto" else f"a {flavour} mpirun"
    raise UsageError(
        f"no mpirun found ({wanted} on PATH)",
        "install one (pip install 'mpilaunch[mpi]' gives Open MPI 5) or pass --mpirun PATH",
    )


def announced_mpi(text: str) -> MpiInfo | None:
    """The MPI an in-cluster launcher names when it starts ("openmpi 4.1.4, 2 workers ready"): its
    mpirun's output is parsed by its rules (an image's Open MPI 4 under a local Open MPI 5)."""
    known = "|".join(re.escape(name) for name in FLAVOURS)
    m = re.match(rf"\s*({known}) (\S+?),?(?:\s|$)", text)
    return MpiInfo(flavour=m.group(1), version=m.group(2), path="(launcher)") if m else None
