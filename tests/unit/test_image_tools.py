"""mpilaunch's pieces outside an image that has mpilaunch (``image_tools.py``, ``backends/k8s/tools.py``).

The copy is run and its entry points started with this machine's system
python3 (no venv, no mpilaunch installed) in an empty environment; the
image check runs against directories that have or lack python3 and an MPI.
The same on real pods with images built from Debian packages only:
``tests/e2e/k8s/test_foreign_image.py``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import tomllib

from mpilaunch.backends.k8s import tools as k8s_tools
from mpilaunch.core import env_names
from mpilaunch.core.version import __version__
from mpilaunch.runtime import image_tools
from support.helpers import REPO

SYSTEM_PYTHON = "/usr/bin/python3"


def test_the_version_is_pyprojects():
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == __version__


@pytest.fixture
def tools(tmp_path) -> Path:
    """What a job's pod sees at /opt/mpilaunch-tools, here."""
    dest = tmp_path / "tools"
    image_tools.write_tools(str(dest))
    return dest


def bare_path(tmp_path: Path, *programs: str) -> str:
    """A PATH with only these programs (and the shell's basics)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for program in ("sh", "cat", "echo") + programs:
        target = shutil.which(program) or program
        (bindir / os.path.basename(program)).symlink_to(target)
    return str(bindir)


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no system python3")
def test_the_rank_wrapper_runs_from_the_copy_and_the_program_does_not_see_it(tools, tmp_path):
    path = bare_path(tmp_path, SYSTEM_PYTHON)
    probe = (
        "import importlib.util, os, sys; print(os.environ.get('PYTHONPATH'), "
        "importlib.util.find_spec('mpilaunch') is not None, any('tools' in p for p in sys.path))"
    )
    ran = subprocess.run(
        [str(tools / "mpilaunch-rank"), "--", "python3", "-c", probe],
        env={"PATH": path, "MPILAUNCH_WORKER": "w-0", "PYTHONPATH": "/user/lib"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["/user/lib", "False", "False"]  # the user's PYTHONPATH, no mpilaunch
    assert "mpilaunch-rank-status: rank=" in ran.stderr and "exit=0" in ran.stderr


def start_as_pid_1(script: Path, started: Path) -> tuple[subprocess.Popen, int]:
    """``script`` as PID 1 of a new PID namespace (as a container's main process is); the
    ``unshare`` process and, once ``started`` exists, the host's pid of that PID 1."""
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", str(script)], env={"PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 30
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the entry point did not start its import"
        time.sleep(0.05)
    return proc, psutil.Process(proc.pid).children()[0].pid


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a PID namespace needs root")
def test_a_pid_1_entry_point_ends_on_sigterm_while_its_module_is_still_importing(tmp_path):
    """A container's PID 1 ignores a signal it has no handler for. The reaper, started with a short
    job's pods, was still importing when the job was released: it ignored SIGTERM and held the
    release until the kubelet's SIGKILL, 2 s later. Its entry point (and the agent's) now ends on
    SIGTERM from its first line. Here the module's import is made slow on purpose."""
    started = tmp_path / "started"
    (tmp_path / "slow_module.py").write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\ndef main():\n    return 3\n"
    )
    for ends_on_sigterm in (True, False):
        script = tmp_path / f"entry-{ends_on_sigterm}"
        script.write_text(image_tools.entry_script("slow_module", str(tmp_path), ends_on_sigterm=ends_on_sigterm))
        script.chmod(0o755)
        started.unlink(missing_ok=True)
        proc, pid_1 = start_as_pid_1(script, started)
        try:
            os.kill(pid_1, signal.SIGTERM)
            if ends_on_sigterm:
                assert proc.wait(timeout=10) == 0  # at once, and as the module's own handler would: exit 0
            else:  # what it guards against: SIGTERM ignored, the import goes on
                with pytest.raises(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.5)
        finally:
            proc.kill()  # --kill-child: the PID 1 goes with it
            proc.wait()
    files = image_tools.tools_files("/opt/t")
    for name, module in image_tools.ENTRY_POINTS.items():
        early = name in ("mpilaunch-reaper", "mpilaunch-agent")
        assert files[name].decode() == image_tools.entry_script(module, "/opt/t/mpilaunch.zip", ends_on_sigterm=early)


def check(tools: Path, path: str, role: str = "worker", mpirun: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", str(tools / "check-image"), role, mpirun],
        env={"PATH": path, "MPILAUNCH_IMAGE": "example/img:1"},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no system python3")
def test_check_image_names_what_the_image_lacks(tools, tmp_path):
    no_python = check(tools, bare_path(tmp_path / "a"))
    assert no_python.returncode == 3
    assert no_python.stderr.strip() == "mpilaunch: the image example/img:1 lacks python3 (3.8 or newer) on PATH"
    no_mpi = check(tools, bare_path(tmp_path / "b", SYSTEM_PYTHON), "launcher")
    assert no_mpi.returncode == 3 and "lacks an MPI: no mpirun or mpiexec on PATH" in no_mpi.stderr
    fine = check(tools, bare_path(tmp_path / "c", SYSTEM_PYTHON, "mpirun.openmpi"), "launcher")
    assert fine.returncode == 3  # named mpirun.openmpi, not mpirun
    mpirun_named = check(
        tools, bare_path(tmp_path / "d", SYSTEM_PYTHON, "mpirun.openmpi"), "launcher", "mpirun.openmpi"
    )
    assert mpirun_named.returncode == 0, mpirun_named.stderr
    missing_named = check(tools, bare_path(tmp_path / "e", SYSTEM_PYTHON), "launcher", "/opt/mpi/bin/mpirun")
    assert "lacks the MPI launcher /opt/mpi/bin/mpirun (--mpirun)" in missing_named.stderr
    line = k8s_tools.image_problem("container exited with 3 (Error): " + no_python.stderr)
    assert line == "the image example/img:1 lacks python3 (3.8 or newer) on PATH"
    assert k8s_tools.image_problem("container exited with 1 (Error)") is None


def test_the_jobs_pieces_unless_the_image_is_said_to_have_them():
    assert k8s_tools.from_configmap({}) and not k8s_tools.from_configmap({env_names.K8S_TOOLS: "image"})
    assert k8s_tools.rank_prefix(True, "python3") == ["/opt/mpilaunch-tools/mpilaunch-rank"]
    assert k8s_tools.rank_prefix(False, "python3") == ["python3", "-m", "mpilaunch.rank"]
    values = k8s_tools.template_values(True, "j")["tools"]
    assert values["name"] == "j-tools" and sorted(values["binary"]) == ["mpilaunch.zip"]
    assert set(values["data"]) == {"check-image", *image_tools.ENTRY_POINTS}
    # a ConfigMap holds at most 1 MiB, its binaryData counted raw (kube-apiserver's ValidateConfigMap):
    # the sources, and as much of the started modules' bytecode as stays under BYTECODE_BUDGET
    raw = len(base64.b64decode(values["binary"]["mpilaunch.zip"])) + sum(map(len, values["data"].values()))
    assert raw <= image_tools.BYTECODE_BUDGET + 10_000 < 1024 * 1024
