"""Before anything is allocated: is the job's program there for its ranks to start? (pure but for
the file system it looks at)

Without it a mistyped program was found only once every worker was up, and
then each rank said so: 128 ranks, 128 lines. Checked on this machine for the
backend whose ranks run this machine's programs with its PATH (local; not
ssh, whose hosts need not share this machine's paths): the first word of the
command as execvp finds it, and for a Python interpreter its script file.
"""

from __future__ import annotations

import os
import re

from . import rank_env
from .errors import UsageError

# python, python3, python3.12 (a path to one too): their first free word is the script to run
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
# short options whose value is the rest of the word or the next word
_PYTHON_VALUE_OPTIONS = "WX"
# long options that take the next word as their value
_PYTHON_LONG_VALUE_OPTIONS = ("--check-hash-based-pycs",)
_PYTHON_NO_SCRIPT = ("--help", "--version", "--help-env", "--help-xoptions", "--help-all")


def python_script(command: list[str]) -> str | None:
    """The script file ``python [options] SCRIPT ...`` runs; None where it runs none (-c, -m, -,
    an interpreter's --help) or the program is no Python."""
    if not command or not _PYTHON.match(os.path.basename(command[0])):
        return None
    words = iter(command[1:])
    for word in words:
        if word == "--":
            return next(words, None)
        if word == "-" or word in _PYTHON_NO_SCRIPT:  # the program comes from stdin, or none runs
            return None
        if word in _PYTHON_LONG_VALUE_OPTIONS:
            next(words, None)
            continue
        if word.startswith("--"):
            continue
        if not word.startswith("-"):
            return word
        for i, flag in enumerate(word[1:], 1):
            if flag in "cm":  # -c CODE, -m MODULE (also glued: -uc, -um): no script file
                return None
            if flag in _PYTHON_VALUE_OPTIONS:
                if i == len(word) - 1:  # -W VALUE: the value is the next word
                    next(words, None)
                break
    return None


def check_program(command: list[str], path: str, cwd: str) -> None:
    """UsageError unless ``command[0]`` resolves with ``path`` (as execvp would, relative to ``cwd``
    when it holds a '/') and, for a Python interpreter, its script file exists in ``cwd``."""
    program = command[0]
    if rank_env.resolve_program(program if "/" not in program else os.path.join(cwd, program), path) is None:
        if "/" in program:
            there = os.path.join(cwd, program)
            why = "is not executable" if os.path.exists(there) else "does not exist"
            raise UsageError(
                f"the program {program} {why}",
                "check the path (a relative one starts in this directory, where the ranks start too)"
                + (
                    "; make it executable (chmod +x) or run it through its interpreter" if os.path.exists(there) else ""
                ),
            )
        raise UsageError(
            f"the program {program!r} is not on PATH",
            "check its name, give its path, or add its directory to PATH (-x PATH=... sets the ranks' PATH)",
        )
    script = python_script(command)
    if script is not None and not os.path.exists(os.path.join(cwd, script)):
        raise UsageError(
            f"the Python script {script} does not exist" + ("" if os.path.isabs(script) else f" in {cwd}"),
            "check the path: a relative one starts in this directory, where the ranks start too",
        )
