"""How a command sent to a worker names the Python it runs (the stacks probe, the free-port ask).

The name comes from a context file, a launch description in a ConfigMap,
or ``sys.executable``: it goes into a ``/bin/sh -c`` command on the worker,
so it is quoted there as one word, and anything that is not a program's
name is refused before a command is built.
"""

from __future__ import annotations

import re
import shlex

from . import env_names

#: a worker whose image mpilaunch does not know: its MPILAUNCH_PYTHON, else python3 (left to the
#: worker's shell on purpose, the one expansion allowed)
CONTAINER_PYTHON = f'"${{{env_names.PYTHON}:-python3}}"'

_BARE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


class BadInterpreter(ValueError):
    """Not an absolute path, a bare program name or ``CONTAINER_PYTHON``."""


def interpreter_word(python: str) -> str:
    """``python`` as one word of a shell command: an absolute path or a bare name (``python3``),
    quoted; ``CONTAINER_PYTHON`` as it is. BadInterpreter for anything else: a control character,
    a leading ``-`` (an option to ``exec``), a relative path, or shell syntax outside a path."""
    if python == CONTAINER_PYTHON:
        return python
    if not isinstance(python, str) or not python or any(ord(c) < 32 or ord(c) == 127 for c in python):
        raise BadInterpreter(f"the workers' Python {python!r} is not a program name (empty, or a control character)")
    if not (python.startswith("/") or _BARE_NAME.fullmatch(python)):
        raise BadInterpreter(f"the workers' Python {python!r} is neither an absolute path nor a program name")
    return shlex.quote(python)
