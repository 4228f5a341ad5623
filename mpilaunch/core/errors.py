"""Errors that map to the exit codes of the command-line contract.

Every error carries a one-line message and a hint; the CLI prints them as
``mpilaunch: error: MESSAGE`` + ``  hint: HINT`` and exits with ``exit_code``.
"""

from __future__ import annotations

from .exit_codes import EXIT_ALLOCATION, EXIT_INTERRUPTED, EXIT_PREFLIGHT, EXIT_RANK_FAILED, EXIT_USAGE


class MpilaunchError(Exception):
    exit_code = EXIT_RANK_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def format(self) -> str:
        text = f"mpilaunch: error: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class UsageError(MpilaunchError):
    """Bad input: wrong options, impossible sizing, missing programs or files."""

    exit_code = EXIT_USAGE


class AllocationError(MpilaunchError):
    """Workers could not be allocated or did not become ready in time."""

    exit_code = EXIT_ALLOCATION


class PreflightFailed(MpilaunchError):
    """--preflight enforce: a worker failed a check; the program never started."""

    exit_code = EXIT_PREFLIGHT
    found: dict | None = None  # what the record keeps (workloads/preflight_run.py)

    def with_found(self, found: dict) -> "PreflightFailed":
        self.found = found
        return self


class Interrupted(MpilaunchError):
    exit_code = EXIT_INTERRUPTED
