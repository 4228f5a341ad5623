"""Issue 51, item 7: the traps a new user fell into without a word, each now one clear line.

a. Kubernetes GPU discovery that cannot list the nodes states its fallback (pure part here; the
   403 itself on the kwok testbed: e2e/k8s/test_silent_traps_k8s.py).
b. --hostfile on the local backend nobody chose is refused (--backend ssh runs on the hosts).
c. A missing program is found before allocating (local); on ssh hosts and cluster backends the ranks'
   identical "cannot start" lines collapse into one.
d. A program given without '--' gets a hint that shows where '--' goes.
e. More GPUs than the listed nodes have is refused before allocating; the scheduler's
   Unschedulable reason reaches the progress line at once.
f. Unknown hostfile keys (``n1 slot=8``) are an error, not one slot.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from mpilaunch.backends.k8s.pods import unschedulable_note
from mpilaunch.core import gpu_slots, hostfile, program_check
from mpilaunch.core.errors import UsageError
from mpilaunch.core.rank_lines import format_status
from mpilaunch.runtime.output import RankOutput
from mpilaunch.runtime.progress import WaitProgress
from support.helpers import REPO


def run_cli(*args, env=None, cwd=REPO):
    env = env or {k: v for k, v in os.environ.items() if k != "MPILAUNCH_BACKEND"}
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def one_error(proc) -> tuple[str, str]:
    """The error line and hint of a refused command line: exit 2, nothing else said."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mpilaunch: error: "), proc.stderr
    assert lines[1].startswith("  hint: "), proc.stderr
    return lines[0], lines[1]


# ------------------------------------------------------------------ a. GPU discovery's fallback


def test_silent_trap_a_discovery_fallback_is_one_warning_line():
    unknown = gpu_slots.GpuDiscovery(unknown_why="cannot list the cluster's nodes (403 Forbidden)")
    warning = gpu_slots.fallback_warning(unknown)
    assert warning == (
        "mpilaunch: warning: cannot list the cluster's nodes (403 Forbidden): assuming 8 GPUs per node; "
        "give --gpus-per-node G if the nodes have another number"
    )
    assert gpu_slots.fallback_warning(gpu_slots.GpuDiscovery(per_node=4, total=16, nodes=4)) is None
    assert gpu_slots.fallback_warning(gpu_slots.GpuDiscovery()) is None  # no cluster to ask: nothing to state


# ------------------------------------------------------------------ b. --hostfile with the default backend


def test_silent_trap_b_hostfile_on_the_default_backend_is_refused(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node-1 slots=4\nnode-2 slots=4\n")
    line, hint = one_error(run_cli("--hostfile", str(hosts), "--dry-run", "--", "true"))
    assert f"--hostfile {hosts} names hosts, but the default backend (local) runs every worker on this machine" in line
    assert "--backend ssh" in hint and "--backend local" in hint
    # chosen, by the option or the environment: local workers named after the hostfile, as before
    chosen = run_cli("--backend", "local", "--hostfile", str(hosts), "--dry-run", "--", "true")
    assert chosen.returncode == 0, chosen.stderr
    assert "node-1 slots=4" in chosen.stdout or "node-1:4" in chosen.stdout, chosen.stdout
    by_env = run_cli(
        "--hostfile", str(hosts), "--dry-run", "--", "true", env={**os.environ, "MPILAUNCH_BACKEND": "local"}
    )
    assert by_env.returncode == 0, by_env.stderr


# ------------------------------------------------------------------ c. a program that does not exist


def test_silent_trap_c_program_is_checked_before_allocating(tmp_path):
    path = os.environ["PATH"]
    (tmp_path / "train.py").write_text("print('hi')\n")
    program_check.check_program(["true"], path, str(tmp_path))
    program_check.check_program([sys.executable, "-u", "train.py", "--lr", "3"], path, str(tmp_path))
    program_check.check_program(["python3", "-c", "import x"], path, str(tmp_path))  # no script file
    with pytest.raises(UsageError, match=r"the program 'no-such-program-51' is not on PATH"):
        program_check.check_program(["no-such-program-51", "-x"], path, str(tmp_path))
    with pytest.raises(UsageError, match=r"the program \./bin/run does not exist"):
        program_check.check_program(["./bin/run"], path, str(tmp_path))
    with pytest.raises(UsageError, match=r"the Python script trian\.py does not exist in "):
        program_check.check_program(["python3", "trian.py"], path, str(tmp_path))
    with pytest.raises(UsageError, match=r"is not executable"):
        program_check.check_program(["./train.py"], path, str(tmp_path))


@pytest.mark.parametrize(
    "command, script",
    [
        (["python", "x.py"], "x.py"),
        (["python3", "-u", "x.py", "--lr", "3"], "x.py"),
        (["/usr/bin/python3.11", "-W", "ignore", "x.py"], "x.py"),
        (["python3", "-Wignore", "-X", "dev", "x.py"], "x.py"),
        (["python3", "--", "x.py"], "x.py"),
        (["python3", "-c", "print(1)"], None),
        (["python3", "-uc", "print(1)"], None),
        (["python3", "-m", "horovod.runner"], None),
        (["python3", "-"], None),
        (["python3", "--version"], None),
        (["sh", "x.py"], None),
    ],
)
def test_silent_trap_c_python_script_is_found_in_the_command(command, script):
    assert program_check.python_script(command) == script


def test_silent_trap_c_identical_cannot_start_lines_collapse_into_one():
    """A program missing on a cluster's workers: 128 ranks each say it; one line names them all."""
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err)
    for rank in range(128):
        sink.feed(
            "stderr", f"[1,{rank}]<stderr>: mpilaunch: error: rank {rank}: cannot start 'trian.py': No such file\n"
        )
        sink.feed("stderr", f"[1,{rank}]<stderr>: " + format_status(str(rank), "w", 127) + "\n")
    # Open MPI 5 passed on some untagged once it began to abort the job: still a rank's line
    sink.feed("stdout", "mpilaunch: error: rank 128: cannot start 'trian.py': No such file\n")
    sink.feed("stderr", "[1,5]<stderr>: mpilaunch: error: rank 5: cannot start 'other': Permission denied\n")
    sink.feed("stderr", "mpirun: a launcher line\n")
    sink.show_unstarted()
    sink.close()  # shown once only
    assert err.getvalue().splitlines() == [
        "mpirun: a launcher line",
        "mpilaunch: error: 129 ranks (0-128): cannot start 'trian.py': No such file",
        "[5] mpilaunch: error: rank 5: cannot start 'other': Permission denied",
    ]
    assert list(sink.tails[7]) == ["mpilaunch: error: rank 7: cannot start 'trian.py': No such file"]
    assert len(sink.statuses) == 128 and list(sink.launcher_tail) == ["mpirun: a launcher line"]


# ------------------------------------------------------------------ d. the program without '--'


def test_silent_trap_d_program_without_dashes_gets_a_hint_with_dashes():
    line, hint = one_error(run_cli("--np", "4", "python", "x.py"))
    assert line == "mpilaunch: error: unrecognized arguments: python x.py"
    assert hint == "  hint: put the program after '--', which ends mpilaunch's options: mpilaunch --np 4 -- python x.py"
    # an option's value that reads like the program is left with its option; quoting kept
    _, hint = one_error(run_cli("--name", "python", "--np", "2", "python", "-c", "print(1)"))
    assert hint.endswith("mpilaunch --name python --np 2 -- python -c 'print(1)'"), hint
    # with '--' given, an unknown option is only an unknown option
    _, hint = one_error(run_cli("--np", "2", "--bogus", "--", "true"))
    assert hint == "  hint: see 'mpilaunch --help'"


# ------------------------------------------------------------------ e. more GPUs than the cluster has


def test_silent_trap_e_request_above_the_listed_total_is_refused():
    listed = gpu_slots.GpuDiscovery(per_node=8, total=128, nodes=16, resource="nvidia.com/gpu")
    gpu_slots.check_capacity(128, listed)
    with pytest.raises(UsageError) as refused:
        gpu_slots.check_capacity(256, listed)
    assert refused.value.message == (
        "--gpus 256 asks for more nvidia.com/gpu than the cluster has: its 16 nodes have 128 allocatable in all"
    )
    assert "--gpus-per-node G, which skips this check" in refused.value.hint
    none = gpu_slots.GpuDiscovery(total=0, nodes=2, resource="nvidia.com/gpu", where=" with --node-selector gpu=a100")
    with pytest.raises(UsageError, match=r"its 2 nodes with --node-selector gpu=a100 have 0 allocatable"):
        gpu_slots.check_capacity(8, none)
    gpu_slots.check_capacity(10**6, gpu_slots.GpuDiscovery())  # nothing listed: nothing to hold it to


def unschedulable_pod(message: str) -> dict:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [condition]}}


def test_silent_trap_e_unschedulable_reason_reaches_the_progress_line():
    said = "0/16 nodes are available: 16 Insufficient nvidia.com/gpu."
    pods = [unschedulable_pod(said), unschedulable_pod(said), {"status": {"phase": "Running"}}]
    note = unschedulable_note(pods)
    assert note == f"2 Unschedulable: {said}"
    assert unschedulable_note([{"status": {"phase": "Pending"}}]) is None
    stream = io.StringIO()
    with WaitProgress("waiting for 2 workers", stream) as progress:
        progress(0, 2, note)
    assert stream.getvalue().startswith(f"mpilaunch: waiting for 2 workers: 0/2 ready, {note} (")


# ------------------------------------------------------------------ f. unknown hostfile keys


def test_silent_trap_f_unknown_hostfile_key_is_an_error(tmp_path):
    with pytest.raises(UsageError) as bad:
        hostfile.parse("n0 slots=2\nn1 slot=8\n")
    assert bad.value.message == "hostfile line 2: unknown key 'slot' in 'n1 slot=8' (did you mean slots=?)"
    assert "slots=, max_slots=, max-slots=" in bad.value.hint
    with pytest.raises(UsageError, match=r"hostfile line 1: unknown word '8' in 'n1 8'"):
        hostfile.parse("n1 8\n")
    with pytest.raises(UsageError, match=r"bad max_slots"):
        hostfile.parse("n1 slots=2 max_slots=0\n")
    assert hostfile.parse("n1 slots=8 max_slots=16\nn2:4\nn3\n") == [("n1", 8), ("n2", 4), ("n3", 1)]
    hosts = tmp_path / "hosts"
    hosts.write_text("n1 slot=8\n")
    line, _ = one_error(run_cli("--backend", "local", "--hostfile", str(hosts), "--dry-run", "--", "true"))
    assert "hostfile line 1: unknown key 'slot'" in line
