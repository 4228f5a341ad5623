"""Process helpers the testbeds share (stdlib only)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """The process runs: it exists and is not a zombie (a zombie child of ours counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
