"""The per-job ``python -IS`` launchers (agent, shim, rank wrapper).

They leave with ``os._exit`` once ``main`` returns, to skip the interpreter's
teardown on the launch's critical path; what a caller relies on must not
change with that: main's exit code, and every byte main wrote, even when it
is still sitting in Python's buffers (stdout to a pipe is block-buffered).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpilaunch.core.pylauncher import SHEBANG_MAX, launcher_text

PROGRAM = """
import sys

def main():
    mode = sys.argv[1]
    sys.stdout.write("out-no-newline")  # stays in the buffer until flushed
    sys.stderr.write("err-no-newline")
    if mode == "return":
        return int(sys.argv[2])
    if mode == "none":
        return None
    if mode == "exit":
        sys.exit(int(sys.argv[2]))
    raise RuntimeError("boom")
"""


def _launcher(tmp_path, python=sys.executable):
    (tmp_path / "fake_main.py").write_text(PROGRAM)
    path = tmp_path / "launch"
    path.write_text(launcher_text("fake_main", python, package_parent=str(tmp_path)))
    path.chmod(0o755)
    return str(path)


def _run(launcher, *args):
    return subprocess.run([launcher, *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("args, code", [(("return", "7"), 7), (("return", "0"), 0), (("none",), 0), (("exit", "3"), 3)])
def test_exit_code_and_buffered_output_survive(tmp_path, args, code):
    r = _run(_launcher(tmp_path), *args)
    assert r.returncode == code
    assert r.stdout == "out-no-newline"
    assert r.stderr == "err-no-newline"


def test_an_exception_still_prints_its_traceback(tmp_path):
    r = _run(_launcher(tmp_path), "raise")
    assert r.returncode == 1
    assert r.stdout == "out-no-newline"
    assert "RuntimeError: boom" in r.stderr


def test_long_interpreter_path_goes_through_sh(tmp_path):
    # a path past the kernel's "#!" limit: the launcher execs it from /bin/sh instead
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    python = deep / "python"
    os.symlink(sys.executable, python)
    assert len(str(python)) + 5 > SHEBANG_MAX
    launcher = _launcher(tmp_path, str(python))
    assert open(launcher).readline() == "#!/bin/sh\n"
    r = _run(launcher, "return", "5")
    assert (r.returncode, r.stdout, r.stderr) == (5, "out-no-newline", "err-no-newline")


def test_interpreter_path_with_space_and_quote_is_quoted_for_sh(tmp_path):
    # a space sends the launcher through /bin/sh; a quote in the path must not end the shell word early
    odd = tmp_path / "it's a dir; echo INJECTED"
    odd.mkdir()
    python = odd / "python"
    os.symlink(sys.executable, python)
    launcher = _launcher(odd, str(python))  # the package directory has the odd name too
    assert open(launcher).readline() == "#!/bin/sh\n"
    r = _run(launcher, "return", "6")
    assert (r.returncode, r.stdout, r.stderr) == (6, "out-no-newline", "err-no-newline")
