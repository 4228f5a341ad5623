"""The ssh testbed for the tests of this folder: three real sshd hosts (testbeds/ssh)."""

from __future__ import annotations

import pytest

from support.helpers import login_user_alone
from support.ssh_bed import started_ssh_bed


@pytest.fixture(autouse=True)
def _login_user_alone():
    """The bed's jobs log in as the non-root tests' user, whose processes those tests count."""
    with login_user_alone():
        yield


@pytest.fixture(scope="session")
def bed():
    cluster = started_ssh_bed(["node-1", "node-2", "node-3"])
    yield cluster
    cluster.stop()
