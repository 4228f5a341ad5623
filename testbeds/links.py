"""The host network links the testbeds make (bridges), and when they go (stdlib only).

An MPI job on this machine lists the machine's addresses when it starts and
may connect or bind to any of them later (Open MPI's TCP transports do, on
every interface but loopback). A testbed that deletes its bridge while an
MPI job of another pytest session runs takes an address from under that
job: seen as ``btl_tcp_endpoint.c: bind on local address (10.233.0.1:0)
failed: Cannot assign requested address`` and a YARN job that hung until
the test's timeout, when the Kubernetes part of a split suite ended and
stopped the real node while the other part ran (2026-11-27).

With ``MPILAUNCH_TESTBED_DEFER_LINKS=FILE`` set, a testbed writes the name
of a link it would delete into FILE instead, and whoever set it
(``scripts/test``, after every session ended) runs
``python -m testbeds.links FILE`` to delete them. Without it (a testbed
started by hand) the link goes at once, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEFER_ENV = "MPILAUNCH_TESTBED_DEFER_LINKS"


def exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def deferred(name: str) -> bool:
    """Whether ``name`` is a link a testbed of this run already gave up (still there, to be deleted at the end)."""
    path = os.environ.get(DEFER_ENV)
    return bool(path) and Path(path).exists() and name in Path(path).read_text().split()


def remove_link(name: str) -> None:
    """Delete the link ``name`` now, or, with DEFER_ENV set, once the whole test run ends."""
    path = os.environ.get(DEFER_ENV)
    if path and exists(name):
        if not deferred(name):
            with open(path, "a") as f:
                f.write(name + "\n")
        return
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def remove_deferred(path: str) -> list[str]:
    """Delete every link listed in ``path`` (and the list): the names of those that were there."""
    listed = Path(path)
    names = sorted(set(listed.read_text().split())) if listed.exists() else []
    removed = [name for name in names if exists(name)]
    for name in removed:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    listed.unlink(missing_ok=True)
    return removed


if __name__ == "__main__":
    gone = remove_deferred(sys.argv[1])
    print(f"testbeds: removed the links the testbeds left for the end of the run: {', '.join(gone) or 'none'}")
