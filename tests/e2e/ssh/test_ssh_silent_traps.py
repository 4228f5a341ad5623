"""Issue 51's missing program on the ssh testbed's hosts (real sshd hosts, each its own network
namespace): the hosts' files are not this machine's concern, so the first host is asked, through
the job's own channel, before mpirun starts. One error line, exit 2, nothing left on any host."""

from __future__ import annotations

import pytest

from support.ssh_jobs import FLAVOURS, PYTHON, assert_hosts_clean, hostfile, run

pytestmark = [pytest.mark.mpi, pytest.mark.ssh]


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: error: ")]


@pytest.mark.parametrize("flavour", ["openmpi4", "mpich"])
def test_silent_trap_missing_program_on_the_hosts_is_refused_before_mpirun(bed, tmp_path, flavour):
    hosts = hostfile(tmp_path, "node-1", "node-2", slots=1)
    proc = run(bed, hosts, FLAVOURS[flavour], "--name", "st-ssh", "--", "no-such-program-51", "--flag")
    assert proc.returncode == 2, proc.stderr
    assert errors(proc.stderr) == [
        "mpilaunch: error: the program 'no-such-program-51' is not on the ranks' PATH on worker node-1"
    ], proc.stderr
    assert "cannot start" not in proc.stderr and "mpilaunch: rank" not in proc.stderr  # mpirun never ran
    assert_hosts_clean(bed)


def test_silent_trap_missing_python_script_on_the_hosts_names_where_it_looked(bed, tmp_path):
    hosts = hostfile(tmp_path, "node-1", slots=2)
    proc = run(bed, hosts, FLAVOURS["openmpi4"], "--name", "st-ssh-py", "--", PYTHON, "-u", "no_such_script_51.py")
    assert proc.returncode == 2, proc.stderr
    (line,) = errors(proc.stderr)
    assert line.startswith(
        "mpilaunch: error: the Python script no_such_script_51.py does not exist on worker node-1 (in /"
    ), line
    assert_hosts_clean(bed)


def test_silent_trap_a_program_the_hosts_have_still_runs(bed, tmp_path):
    proc = run(bed, hostfile(tmp_path, "node-1", "node-2", slots=1), FLAVOURS["mpich"], "--", "/bin/echo", "RAN")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RAN") == 2
    assert_hosts_clean(bed)
