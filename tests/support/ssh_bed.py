"""A started ssh testbed (testbeds/ssh) for a test module or session, or the test's require()."""

from __future__ import annotations

from support.mpi_installs import require


def started_ssh_bed(hosts: list[str], user: str | None = None):
    """Real sshd hosts, each a network namespace of its own, logged into as ``user`` (default: the
    unprivileged tests' user where it exists, else root). The caller stops it."""
    try:
        from testbeds.ssh.cluster import SshCluster, missing_prerequisites
    except ImportError as e:
        require(f"ssh testbed not importable: {e}")
    missing = missing_prerequisites()
    if missing:
        require("the ssh testbed needs " + ", ".join(missing) + " (apt-get install openssh-server openssh-client)")
    bed = SshCluster(hosts, user=user)
    try:
        bed.start()
    except Exception as e:  # the testbed's own error names the cause
        bed.stop()
        require(f"ssh testbed did not start: {e}")
    return bed
