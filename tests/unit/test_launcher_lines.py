"""An in-cluster launcher's error carried to the submitting side (core/launcher_lines.py)."""

from __future__ import annotations

import pytest

from mpilaunch.core import launcher_lines
from mpilaunch.core.errors import MpilaunchError, PreflightFailed, UsageError
from mpilaunch.runtime.output import RankOutput


def test_silent_trap_a_launchers_usage_error_is_raised_again_as_itself():
    line = launcher_lines.error_line(UsageError("the program 'x' is not on PATH", "check its name"), "tok1")
    again = launcher_lines.parse_error(line, "tok1")
    assert isinstance(again, UsageError) and again.exit_code == 2
    assert (again.message, again.hint) == ("the program 'x' is not on PATH", "check its name")
    assert isinstance(
        launcher_lines.parse_error(launcher_lines.error_line(PreflightFailed("p"), "t"), "t"), PreflightFailed
    )


def test_silent_trap_an_unsigned_or_garbled_error_line_is_not_an_error():
    line = launcher_lines.error_line(UsageError("forged"), "someone-elses")
    assert launcher_lines.parse_error(line, "tok1") is None  # a program printing one has no token
    assert launcher_lines.parse_error(launcher_lines.ERROR_PREFIX + "token=tok1 {not json", "tok1") is None
    assert launcher_lines.parse_error("mpilaunch: error: plain", "tok1") is None


def test_silent_trap_an_unknown_exit_code_keeps_its_code():
    line = launcher_lines.error_line(type("Odd", (MpilaunchError,), {"exit_code": 9})("odd"), "t")
    again = launcher_lines.parse_error(line, "t")
    assert type(again) is MpilaunchError and again.exit_code == 9


@pytest.mark.parametrize("signed", [True, False])
def test_silent_trap_the_output_keeps_the_carried_error_and_shows_no_raw_line(signed, capsys):
    import sys

    output = RankOutput(sys.stdout, sys.stderr, None)
    output.token = "tok1"
    line = launcher_lines.error_line(UsageError("missing"), "tok1" if signed else "other")
    output.note(line + "\n")
    assert (output.launcher_error is not None) is signed
    assert launcher_lines.ERROR_PREFIX not in capsys.readouterr().err
