"""The first worker's program check (workloads/program_probe.py): its script, run by a real ``sh``
in a directory laid out like a worker's, and the one line each answer makes."""

from __future__ import annotations

import os
import subprocess

import pytest

from mpilaunch.workloads import program_probe


def answer(text: str, home, env_path: str = "/usr/bin:/bin") -> str:
    out = subprocess.run(
        ["sh", "-c", text], capture_output=True, text=True, env={"HOME": str(home), "PATH": env_path}, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def worker(tmp_path):
    """A worker's files: a home with a script and a bin directory with one program."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    tool = home / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (home / "train.py").write_text("print(1)\n")
    (home / "notes.txt").write_text("")
    return home


def test_silent_trap_program_on_the_path_the_ranks_get_is_found(worker):
    text = program_probe.script("tool", None, f"/usr/bin:{worker}/bin", None, None)
    assert answer(text, worker) == "ok /"
    # the worker's own PATH (None) has no such directory
    assert answer(program_probe.script("tool", None, None, None, None), worker) == "not-on-path /"


def test_silent_trap_relative_program_and_script_are_looked_for_in_home_when_mpiruns_dir_is_missing(worker):
    # Open MPI: mpirun's directory where the worker has it, else $HOME
    text = program_probe.script("python3", "train.py", None, "/no/such/dir/here", None)
    assert answer(text, worker) == f"ok {worker}"
    text = program_probe.script("python3", "other.py", None, "/no/such/dir/here", None)
    assert answer(text, worker) == f"no-script {worker}"
    assert answer(program_probe.script("./bin/tool", None, None, str(worker), None), worker) == f"ok {worker}"
    assert (
        answer(program_probe.script("./notes.txt", None, None, str(worker), None), worker) == f"not-executable {worker}"
    )
    assert answer(program_probe.script("./nope", None, None, str(worker), None), worker) == f"missing {worker}"


def test_silent_trap_a_directory_on_path_named_like_the_program_is_no_program(worker):
    (worker / "bin" / "train").mkdir()
    assert answer(program_probe.script("train", None, f"{worker}/bin", None, None), worker) == "not-on-path /"


def test_silent_trap_mpich_ranks_start_in_the_sessions_directory(worker):
    # --worker-cwd: no mpirun directory, the session's start directory (the context's cwd)
    text = program_probe.script("python3", "train.py", None, None, str(worker))
    assert answer(text, worker) == f"ok {worker}"


def test_silent_trap_quotes_hold_against_odd_names(worker):
    odd = worker / "it's $(touch pwned)"
    odd.write_text("#!/bin/sh\n")
    odd.chmod(0o755)
    assert answer(program_probe.script(str(odd), None, None, None, None), worker) == "ok /"
    assert not os.path.exists("pwned") and not (worker / "pwned").exists()


@pytest.mark.parametrize(
    "said, first_line",
    [
        ("not-on-path /root", "the program 'tool' is not on the ranks' PATH on worker j-worker-0"),
        ("missing /home/u", "the program tool does not exist on worker j-worker-0 (in /home/u)"),
        ("not-executable /w", "the program tool is not executable on worker j-worker-0 (in /w)"),
    ],
)
def test_silent_trap_each_answer_is_one_error_with_a_hint(said, first_line):
    refused = program_probe.refusal(said, ["tool", "-x"], "j-worker-0")
    assert refused.message == first_line and refused.hint


def test_silent_trap_script_refusal_names_the_script_and_where():
    refused = program_probe.refusal("no-script /home/u", ["python3", "-u", "train.py"], "w0")
    assert refused.message == "the Python script train.py does not exist on worker w0 (in /home/u)"


def test_silent_trap_no_answer_or_ok_refuses_nothing():
    assert program_probe.refusal("ok /", ["tool"], "w") is None
    assert program_probe.refusal("", ["tool"], "w") is None

    def unreachable(_command, _timeout):
        raise OSError("connection refused")

    assert program_probe.check_first_worker({"w": unreachable}, "w", ["tool"], "true") is None
    assert program_probe.check_first_worker({}, "w", ["tool"], "true") is None


def test_silent_trap_check_first_worker_asks_through_the_capture(worker):
    def capture(text, _timeout):
        out = subprocess.run(["sh", "-c", text], capture_output=True, env={"HOME": str(worker), "PATH": "/bin"})
        return out.returncode, out.stdout, out.stderr

    text = program_probe.script("no-such-program-51", None, None, None, None)
    refused = program_probe.check_first_worker({"w": capture}, "w", ["no-such-program-51"], text)
    assert refused is not None and "not on the ranks' PATH on worker w" in refused.message
