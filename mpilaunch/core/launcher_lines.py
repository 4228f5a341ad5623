"""An in-cluster launcher's own lines, as the submitting side tells them from mpirun's output.

A launcher in the cluster (a pod, a YARN container) runs the same lifecycle as
mpilaunch on a login node, so it finds the same things: a worker that fails
``--preflight`` or straggles (``NOTES``: shown to the user as they are), and
bad input that only the workers could reveal, such as a program their image
lacks (an ``MpilaunchError`` with its exit code). Such an error travels as one
line signed with the launch's token (``ERROR_PREFIX``: a program printing one
cannot forge it, it never sees the token) and is raised again on the
submitting side, so the user reads ``mpilaunch: error: ...`` plus its hint and
gets its exit code, as with ``--launcher local``, instead of "mpirun exited
with code 1".
"""

from __future__ import annotations

import json

from .errors import AllocationError, MpilaunchError, PreflightFailed, UsageError

ERROR_PREFIX = "mpilaunch: launcher: error "
#: a swap the launcher made itself (``swap_line``): the submitting side's bookkeeping, not shown
SWAP_PREFIX = "mpilaunch: launcher: swap "
#: the launcher's own verdicts and errors, and its own relaunches (a spare swapped in), never
#: mpirun's output
NOTES = (
    "mpilaunch: preflight:",
    "mpilaunch: straggler:",
    "mpilaunch: spare ",
    "mpilaunch: attempt ",
    ERROR_PREFIX,
)

_CLASSES = {cls.exit_code: cls for cls in (UsageError, AllocationError, PreflightFailed)}


def error_line(error: MpilaunchError, token: str | None) -> str:
    """The one line that carries ``error`` (no newline)."""
    said = {"exit": error.exit_code, "message": error.message, "hint": error.hint}
    return f"{ERROR_PREFIX}token={token or ''} {json.dumps(said)}"


def parse_error(text: str, token: str | None) -> MpilaunchError | None:
    """The error an ``error_line`` carries, when it is signed with ``token``; None otherwise."""
    if not text.startswith(ERROR_PREFIX):
        return None
    signed, _, body = text[len(ERROR_PREFIX) :].strip().partition(" ")
    if token and signed != f"token={token}":
        return None
    try:
        said = json.loads(body)
        code, message, hint = int(said["exit"]), str(said["message"]), said.get("hint")
    except (ValueError, KeyError, TypeError):
        return None
    error = _CLASSES.get(code, MpilaunchError)(message, hint if isinstance(hint, str) else None)
    error.exit_code = code
    return error


def swap_line(taken: dict[str, str], why: str, failure: str | None, exit_code: int | None, token: str | None) -> str:
    """The one line (no newline) that tells the submitting side of the launcher's swap: which spare
    now serves which worker, and why; where ``why`` is "lost", the exit code and failure of the
    attempt it ended. Signed as ``error_line``: the submitting side deletes pods on its word."""
    said = {
        "swaps": [{"worker": w, "spare": s, "why": why} for w, s in taken.items()],
        "failure": failure,
        "exit_code": exit_code,
    }
    return f"{SWAP_PREFIX}token={token or ''} {json.dumps(said)}"


def swap_line_after(taken: dict[str, str], why: str, ended, token: str | None) -> str:
    """``swap_line`` with the failure (its first line) and exit code of ``ended``, the ``JobResult``
    of the attempt the swap ends (None: a swap before the program, --preflight enforce's)."""
    failure = ended.failure.split("\n", 1)[0] if ended is not None and ended.failure else None
    return swap_line(taken, why, failure, ended.exit_code if ended is not None else None, token)


def parse_swap(text: str, token: str | None) -> dict | None:
    """What a ``swap_line`` signed with ``token`` says (``swaps``: [{worker, spare, why}], ``failure``,
    ``exit_code``);
    None for any other line, a malformed one, or any line without a token to check it by (it
    moves pods: unlike an error, it is never taken on trust)."""
    if not text.startswith(SWAP_PREFIX):
        return None
    signed, _, body = text[len(SWAP_PREFIX) :].strip().partition(" ")
    if not token or signed != f"token={token}":
        return None
    try:
        said = json.loads(body)
        swaps = [{key: str(entry[key]) for key in ("worker", "spare", "why")} for entry in said["swaps"]]
    except (ValueError, KeyError, TypeError):
        return None
    failure, code = said.get("failure"), said.get("exit_code")
    return {
        "swaps": swaps,
        "failure": failure if isinstance(failure, str) else None,
        "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else None,
    }
