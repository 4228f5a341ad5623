"""A detached YARN job's outcome, as its application's final diagnostics carry it (pure: no I/O).

A detached job has nobody on the submitting side, so its launcher container
ends the application itself (``detached.py``) with
diagnostics the ResourceManager keeps after the ApplicationMaster is gone::

    mpilaunch: exit 7: rank 2 on worker NAME-worker-0 exited with code 7
    launcher log: container_..._000003 on host:8042

``mpilaunch wait|status|logs NAME --backend yarn`` read them back from the
RM's application report: the first line gives the exit code and failure, the
second where the launcher's output (its container log) stays.
"""

from __future__ import annotations

import json
import re

from ...core.exit_codes import EXIT_INTERRUPTED

# skein writes a service's stdout and stderr, merged, to <service>.log in the container's log directory.
LAUNCHER_LOG = "launcher.log"
MAX_FAILURE_CHARS = 800  # the RM keeps diagnostics whole, but the launcher line must survive any cut
TERMINAL_STATES = ("FINISHED", "FAILED", "KILLED")

SUMMARY_PREFIX = "mpilaunch summary: "
_EXIT_RE = re.compile(r"mpilaunch: exit (\d+): ?([^\n]*)")
_LOG_RE = re.compile(r"launcher log: (container_\S+) on (\S+)")


def diagnostics(
    exit_code: int, failure: str | None, container: str | None, node_http: str | None, facts: dict | None = None
) -> str:
    """What the launcher hands to ``shutdown``: the exit code and the failure's first line, then its log,
    then the closing summary's facts (``summary.compact``: one JSON line, a few hundred bytes; last, so
    that a cut diagnostics loses it alone)."""
    first = (failure or "").split("\n", 1)[0].strip()
    if not first:
        first = "job succeeded" if exit_code == 0 else f"job failed with exit code {exit_code}"
    text = f"mpilaunch: exit {exit_code}: {first[:MAX_FAILURE_CHARS]}"
    if container and node_http:
        text += f"\nlauncher log: {container} on {node_http}"
    if facts:
        text += f"\n{SUMMARY_PREFIX}{json.dumps(facts, separators=(',', ':'))}"
    return text


def summary_facts(diag: str | None) -> dict | None:
    """The closing summary's facts a detached job's launcher left in the diagnostics; None: none
    (an older launcher, a job that ended before its report, or diagnostics cut short)."""
    for line in (diag or "").splitlines():
        if line.startswith(SUMMARY_PREFIX):
            try:
                facts = json.loads(line[len(SUMMARY_PREFIX) :])
            except ValueError:
                return None
            return facts if isinstance(facts, dict) and "exit_code" in facts else None
    return None


def outcome(state: str, final_status: str, diag: str | None) -> tuple[str, int | None, str | None]:
    """(phase, exit code or None while it runs, failure or None) of a detached job's application."""
    if state not in TERMINAL_STATES:
        return state, None, None
    found = _EXIT_RE.search(diag or "")
    if found:
        code = int(found.group(1))
        return ("SUCCEEDED" if code == 0 else "FAILED"), code, (found.group(2) or None) if code else None
    short = " ".join((diag or "").split())[:300] or "no diagnostics"
    if state == "KILLED":
        # `mpilaunch delete`, `yarn application -kill`, or a preemption: nobody's exit code, an interruption
        return "KILLED", EXIT_INTERRUPTED, f"the YARN application was killed before the job ended: {short}"
    if final_status == "SUCCEEDED":
        return "SUCCEEDED", 0, None
    return "FAILED", 1, f"the YARN application ended {state}/{final_status} without mpilaunch's outcome: {short}"


def launcher_log(diag: str | None) -> tuple[str, str] | None:
    """(container id, NodeManager web address) of the launcher container, once the job ended."""
    found = _LOG_RE.search(diag or "")
    return (found.group(1), found.group(2)) if found else None


def log_contents(text: str) -> str:
    """A container log file as the NodeManager's REST API returns it, without its framing.

    A running container's file comes raw; an ended one's in the aggregated
    format (``LogType:...``, ``LogContents:``, the text, ``End of LogType:...``).
    """
    head, sep, rest = text.partition("\nLogContents:\n")
    if not sep or not head.lstrip().startswith("Container: "):
        return text
    body, _, _ = rest.rpartition("End of LogType:")
    return body
