"""Before mpirun, where the ranks do not run this machine's programs (ssh hosts, pods, YARN
containers): is the job's program there for the ranks of the first worker?

Without it a mistyped program, or one the image lacks, was found only once
mpirun had started every daemon: each rank said "cannot start" (collapsed
into one line naming the ranks, but after the whole launch). One exec session
on the first worker, through the job's own channel (the one the shims and
the hang probe use), looks for the program as the rank wrapper will: with
the PATH the program gets (the user's ``-x PATH=...``, else the launcher's
where the workers are sent it, else the worker's own) and in the directory
the ranks start in (mpirun's where the worker has it, else ``$HOME``, as Open
MPI does; the worker's own for MPICH's connect-back proxies). Only a definite
"not there" stops the job; a worker that cannot be asked leaves it to the
ranks' own line. The local backend checks on this machine instead, before
anything is allocated (``core/program_check.py``).
"""

from __future__ import annotations

import shlex
import time

from ..core.errors import UsageError
from ..core.program_check import python_script

#: the most the check may add to a launch whose worker does not answer
DEADLINE_S = 10.0
OK = "ok"


def script(program: str, python_file: str | None, path: str | None, cwd: str | None, start_dir: str | None) -> str:
    """The ``sh`` text that answers one word (``ok``, ``missing``, ``not-executable``,
    ``not-on-path``, ``no-script``) and the directory it looked in.

    ``path``: the program's PATH, None for the worker's own; ``cwd``: mpirun's directory (tried
    first, then ``$HOME``); ``start_dir``: where the session starts first (the context's ``cwd``,
    the worker's directory the MPICH ranks go back to), None to stay."""
    lines = []
    if start_dir:
        lines.append(f"cd {shlex.quote(start_dir)} 2>/dev/null")
    if cwd:
        lines.append(f'cd {shlex.quote(cwd)} 2>/dev/null || cd "$HOME" 2>/dev/null')
    if path is not None:
        lines.append(f"PATH={shlex.quote(path)}")
    lines += [
        f"p={shlex.quote(program)}",
        'here="$(pwd)"',
        'case "$p" in',
        '*/*) if [ ! -x "$p" ] || [ -d "$p" ]; then',
        '       if [ -e "$p" ]; then echo "not-executable $here"; else echo "missing $here"; fi; exit 0',
        "     fi ;;",
        "*) found=; IFS=:",
        '   for d in $PATH; do [ -n "$d" ] || d=.; if [ -x "$d/$p" ] && [ ! -d "$d/$p" ]; then found=1; break; fi; done',
        '   [ -n "$found" ] || { echo "not-on-path $here"; exit 0; } ;;',
        "esac",
    ]
    if python_file is not None:
        lines.append(f'[ -e {shlex.quote(python_file)} ] || {{ echo "no-script $here"; exit 0; }}')
    lines.append(f'echo "{OK} $here"')
    return "\n".join(lines)


def refusal(answer: str, command: list[str], worker: str) -> UsageError | None:
    """The one-line error for the first worker's answer; None when the program is there (or the
    answer is no answer this check knows)."""
    word, _, here = answer.strip().partition(" ")
    program = command[0]
    where = f"on worker {worker}" + (f" (in {here})" if here else "")
    relative = "a relative path starts where the ranks start: mpirun's directory where the worker has it, else $HOME"
    if word == "not-on-path":
        return UsageError(
            f"the program {program!r} is not on the ranks' PATH on worker {worker}",
            "check its name, install it in the worker's image or host, give its path, "
            "or set the ranks' PATH with -x PATH=...",
        )
    if word == "missing":
        return UsageError(f"the program {program} does not exist {where}", f"check the path ({relative})")
    if word == "not-executable":
        return UsageError(
            f"the program {program} is not executable {where}",
            "make it executable (chmod +x) or run it through its interpreter",
        )
    if word == "no-script":
        return UsageError(
            f"the Python script {python_script(command)} does not exist {where}",
            f"check the path ({relative}); the workers need their own copy (in the image, or on a shared filesystem)",
        )
    return None


def check_first_worker(captures: dict, worker: str, command: list[str], text: str) -> UsageError | None:
    """Ask ``worker`` (its ``capture(command, timeout)``) the script ``text``; the refusal its answer
    makes, or None (also where the worker could not be asked: the ranks' own line says it then)."""
    capture = captures.get(worker)
    if capture is None:
        return None
    t0 = time.monotonic()
    try:
        status, out, _err = capture(text, DEADLINE_S)
    except (TimeoutError, OSError, ValueError):
        return None
    if status != 0 or time.monotonic() - t0 > DEADLINE_S:
        return None
    lines = out.decode(errors="replace").strip().splitlines()
    return refusal(lines[-1], command, worker) if lines else None
