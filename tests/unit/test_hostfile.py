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
