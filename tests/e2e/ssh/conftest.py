"""The ssh testbed for the tests of this folder: three real sshd hosts (testbeds/ssh)."""

from __future__ import annotations

import pytest

from support.helpers import login_user_alone
from support.mpi_installs import require


@pytest.fixture(autouse=True)
def _login_user_alone():
    """The bed's jobs log in as the non-root tests' user, whose processes those tests count."""
    with login_user_alone():
        yield


@pytest.fixture(scope="session")
def bed():
    try:
        from testbeds.ssh.cluster import SshCluster, missing_prerequisites
    except ImportError as e:
        require(f"ssh testbed not importable: {e}")
    missing = missing_prerequisites()
    if missing:
        require("the ssh testbed needs " + ", ".join(missing) + " (apt-get install openssh-server openssh-client)")
    cluster = SshCluster(["node-1", "node-2", "node-3"])
    try:
        cluster.start()
    except Exception as e:  # the testbed's own error names the cause
        cluster.stop()
        require(f"ssh testbed did not start: {e}")
    yield cluster
    cluster.stop()
