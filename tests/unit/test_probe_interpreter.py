"""The stacks probe's interpreter is one quoted word of the worker's shell command (issue 49, low).

It comes from a context file, a launch description (a ConfigMap the namespace's
``edit`` users may change) or ``sys.executable``; before, it went into
``exec {python} -c ...`` as it was, so a name with shell syntax ran that too.
The commands below are run by a real ``/bin/sh``, as the worker's agent runs them.
"""

import subprocess
import sys

import pytest

from mpilaunch.hang.collect import probe_command


def test_probe_interpreter_with_shell_syntax_runs_nothing_else(tmp_path):
    marker = tmp_path / "ran"
    hostile = f"/usr/bin/python3; touch {marker}; exit 0; #"
    try:
        command = probe_command(hostile, 1.0)
    except ValueError:  # refused (core.interpreter.BadInterpreter)
        command = None
    if command is not None:  # quoted: the shell looks for a program of that whole name
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert done.returncode != 0
    assert not marker.exists(), "the interpreter's name ran a command of its own"


@pytest.mark.parametrize(
    "python",
    ["python3; id", "$(id)", "`id`", "-i", "bin/python3", "", "python3\nid", "python3 -c 1", "a|b"],
)
def test_probe_interpreter_that_is_no_program_name_is_refused(python):
    from mpilaunch.core.interpreter import BadInterpreter

    with pytest.raises(BadInterpreter):
        probe_command(python, 1.0)


def test_probe_interpreter_paths_names_and_the_containers_own_run(tmp_path):
    from mpilaunch.backends.rendezvous import rank_python
    from mpilaunch.core.interpreter import CONTAINER_PYTHON, interpreter_word

    spaced = tmp_path / "my env" / "python"
    spaced.parent.mkdir()
    spaced.symlink_to(sys.executable)
    for python in (sys.executable, str(spaced), "python3", CONTAINER_PYTHON):
        word = interpreter_word(python)
        assert probe_command(python, 1.0).startswith(f"exec {word} -c ")
        done = subprocess.run(["/bin/sh", "-c", f"exec {word} -c 'print(42)'"], capture_output=True, text=True)
        assert done.stdout.strip() == "42", (python, word, done.stderr)
    assert interpreter_word(str(spaced)) == f"'{spaced}'"
    assert rank_python(["/opt/x/bin/python3", "-m", "mpilaunch.rank"]) == "/opt/x/bin/python3"
    assert rank_python(["python3"]) == CONTAINER_PYTHON
