"""A rank the kernel's out-of-memory killer ends is named as such, not as a bare "exit 137".

Real kernel, real memory cgroup: the test creates a memory cgroup with a
400 MiB limit below its own, runs the whole job in it (local backend), and
rank 1 allocates 1 GiB. The rank wrapper sees its program SIGKILLed while
its cgroup's OOM kill count rose (cgroup v1 ``memory.oom_control``, v2
``memory.events``). The same holds in a Kubernetes pod or a YARN container
with a memory limit: the wrapper reads the cgroup it runs in.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.rank import memory_cgroup_file
from support.helpers import REPO, leftover_processes, mpilaunch_env

pytestmark = pytest.mark.mpi
LIMIT = 400 << 20


@pytest.fixture
def memory_limited_cgroup():
    own = memory_cgroup_file(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    if own is None:
        pytest.skip("no memory cgroup mounted on this machine")
    v2 = own.endswith("memory.events")
    cgroup = Path(own).parent / f"mpilaunch-oom-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        (cgroup / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup here ({e.strerror}): needs root and a writable cgroup tree")
    yield cgroup
    deadline = time.monotonic() + 10
    while True:
        try:
            cgroup.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_rank_killed_by_the_oom_killer_is_named_as_such(openmpi5, memory_limited_cgroup, tmp_path):
    job = "oom-rank"
    env = mpilaunch_env(PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"])
    argv = [
        "sh",
        "-c",
        f'echo $$ > {memory_limited_cgroup / "cgroup.procs"} && exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "mpilaunch",
        "--name",
        job,
        "--np",
        "2",
        "--slots-per-worker",
        "1",
        "-q",
        "--output-dir",
        str(tmp_path / "out"),
        "-x",
        "EAT_RANK=1",
        "-x",
        "EAT_MIB=1024",
        "--",
        sys.executable,
        "tests/programs/eat_memory.py",
    ]
    proc = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, timeout=180)
    assert "was not killed" not in proc.stdout, "the memory limit did not hold"
    assert proc.returncode == 137, proc.stderr[-3000:]
    first = next(line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: error: "))
    assert first.startswith(
        f"mpilaunch: error: rank 1 on worker {job}-worker-1 exited with code 137: "
        "killed by the kernel's out-of-memory killer"
    ), proc.stderr[-3000:]
    ranks = json.loads((tmp_path / "out" / "report.json").read_text())["ranks"]
    assert [(r["rank"], r["oom_killed"]) for r in ranks] == [(0, False), (1, True)]
    assert leftover_processes(job) == []


def test_a_rank_killed_by_a_plain_sigkill_is_not_called_out_of_memory(openmpi5, tmp_path):
    job = "sigkill-rank"
    env = mpilaunch_env(PATH=os.path.dirname(openmpi5.mpirun) + os.pathsep + os.environ["PATH"])
    argv = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--name",
        job,
        "--np",
        "2",
        "--slots-per-worker",
        "1",
        "-q",
        "--output-dir",
        str(tmp_path / "out"),
        "--",
        "sh",
        "-c",
        '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -9 $$; sleep 60',
    ]
    proc = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 137, proc.stderr[-3000:]
    first = next(line for line in proc.stderr.splitlines() if line.startswith("mpilaunch: error: "))
    assert first == f"mpilaunch: error: rank 1 on worker {job}-worker-1 exited with code 137", first
    ranks = json.loads((tmp_path / "out" / "report.json").read_text())["ranks"]
    assert not any(r["oom_killed"] for r in ranks)
