"""-x values in no command line: a forwarded value reaches every rank through mpirun's environment.

``-x NAME=VALUE`` used to become ``-x NAME=VALUE`` (Open MPI) or ``-genv NAME
VALUE`` (Hydra) on mpirun's argv, which every user of a login node reads with
``ps``. Now argv only names the variable (``-x NAME``, ``-genvlist A,B``) and
mpirun takes the value from its own environment. Each test runs a real job on
the local backend while the ranks wait, then reads every process's command
line on this machine (mpirun, the shims, the workers' agents, the MPI
daemons and proxies, the ranks): none may hold the value, and every rank
must have seen it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import psutil
import pytest

from support.helpers import REPO, agent_workers, leftover_processes, mpilaunch_env, wait_started

pytestmark = pytest.mark.mpi

SECRET = "s3cr3t-value"


def processes_holding(value: str) -> tuple[list[str], list[int]]:
    """(``pid: cmdline`` of every process whose command line holds ``value``, pids whose environment does)."""
    on_argv, in_env = [], []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if value in cmd:
            on_argv.append(f"{p.info['pid']}: {cmd[:200]}")
        if any(value in v for v in (p.info["environ"] or {}).values()):
            in_env.append(p.info["pid"])
    return on_argv, in_env


@pytest.mark.parametrize("np_,slots", [(4, 2)])
def test_secret_env_value_on_no_command_line_local(mpi_install, tmp_path, np_, slots):
    name = f"secret-env-{mpi_install.id}"
    # unique per run: a stale process or log of an earlier run cannot satisfy the check
    secret = f"{SECRET}-{time.time_ns()}"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    release = tmp_path / "release"
    cmd = [
        sys.executable,
        "-m",
        "mpilaunch",
        "--mpirun",
        mpi_install.mpirun,
        "--name",
        name,
        "--np",
        str(np_),
        "--slots-per-worker",
        str(slots),
        "-q",
        "-x",
        f"SECRET_TOKEN={secret}",
        "--",
        sys.executable,
        "tests/programs/secret_env.py",
        digest,
        str(release),
    ]
    # the test's own Popen argv holds the value (it is the user typing it): scanned from here on
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=mpilaunch_env(mpi_install), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        lines = wait_started(proc, np_, text="SECRET_SEEN")
        on_argv, in_env = processes_holding(secret)
        # only mpilaunch's own command line (what the user typed) may hold it: mpilaunch itself, and
        # the agents it forked, which show the very same command line (no copy of the value elsewhere)
        typed = " ".join(psutil.Process(proc.pid).cmdline())[:200]
        forked = set(agent_workers())
        on_argv = [
            c
            for c in on_argv
            if not c.startswith(f"{proc.pid}: ")
            and not (int(c.split(":", 1)[0]) in forked and c.split(": ", 1)[1] == typed)
        ]
        assert on_argv == [], on_argv
        # where it travels instead: mpirun's environment (and the ranks' own)
        assert len(in_env) >= 1 + np_, in_env
        seen = sorted(line.split("SECRET_SEEN ", 1)[1].split() for line in lines if "SECRET_SEEN " in line)
        assert [s[0] for s in seen] == [f"rank={r}" for r in range(np_)], lines
        assert all(s[2] == "match=yes" for s in seen), lines
        assert {s[1] for s in seen} == {f"worker={name}-worker-{w}" for w in range(np_ // slots)}, lines
    finally:
        release.write_text("")
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert secret not in err
    assert leftover_processes(name) == []
