import pytest

from mpilaunch.core import hostfile
from mpilaunch.core.errors import UsageError

HOSTS = [("job-worker-0", 8), ("job-worker-1", 8)]


def test_render_openmpi():
    assert hostfile.render(HOSTS, "openmpi") == "job-worker-0 slots=8\njob-worker-1 slots=8\n"


@pytest.mark.parametrize("flavour", ["mpich", "intel"])
def test_render_hydra(flavour):
    assert hostfile.render(HOSTS, flavour) == "job-worker-0:8\njob-worker-1:8\n"


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_round_trip(flavour):
    assert hostfile.parse(hostfile.render(HOSTS, flavour)) == HOSTS


def test_parse_comments_defaults_and_extra_options():
    text = "# cluster\nnode1 slots=4 max_slots=8\n\nnode2\nnode3:2  # trailing\n"
    assert hostfile.parse(text) == [("node1", 4), ("node2", 1), ("node3", 2)]


def test_bad_slots_is_a_usage_error():
    with pytest.raises(UsageError, match="line 1"):
        hostfile.parse("node1 slots=zero\n")


def test_empty_hostfile_rejected():
    with pytest.raises(UsageError, match="no hosts"):
        hostfile.parse("# nothing\n")


def test_unreadable_hostfile(tmp_path):
    with pytest.raises(UsageError, match="cannot read hostfile"):
        hostfile.read(str(tmp_path / "missing"))


# issue 49: a hostfile's names become file names (the local backend's agent logs in the run directory)
# and words of commands (ssh targets)
@pytest.mark.parametrize(
    "text",
    ["../../etc/x slots=2\n", "a/b:2\n", "alice@node1 slots=1\n", "-oProxyCommand=x slots=1\n", "-x:1\n"],
)
def test_hostfile_names_with_a_slash_an_at_or_a_leading_dash_are_refused(text):
    with pytest.raises(UsageError, match="line 1: host name .* has a '/', an '@' or a leading '-'") as err:
        hostfile.parse(text)
    assert err.value.hint and "--ssh-option User=NAME" in err.value.hint


def test_hostfile_names_with_a_slash_exit_2_with_one_line_and_nothing_started(tmp_path):
    """`mpilaunch --hostfile` with a name that would write outside the run directory: exit 2, the
    error line and its hint, no agent started, no file written where the name points."""
    import subprocess
    import sys

    escape = tmp_path / "escaped"
    hosts = tmp_path / "hosts"
    hosts.write_text(f"../../../../../../..{escape} slots=1\nnode-b slots=1\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpilaunch",
            "--backend",
            "local",
            "--name",
            "hostfile-names",
            "--hostfile",
            str(hosts),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[0].startswith("mpilaunch: error: hostfile line 1: host name"), proc.stderr
    assert len(lines) == 2 and lines[1].startswith("  hint: "), proc.stderr
    assert not list(tmp_path.glob("escaped*"))
