"""The suite's unprivileged second user (scripts/nonroot-user.sh), for tests of what one local user
can do to another's job: made if missing, held by one test at a time (``login_user_alone``), and a
directory both users may write to, as /tmp."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from support.helpers import REPO, login_user_alone

USER = os.environ.get("MPILAUNCH_NONROOT_USER", "mpilaunch-user")
SETUP = REPO / "scripts" / "nonroot-user.sh"


@contextlib.contextmanager
def other_user_alone(on_setup_failure):
    """The user's passwd entry, the user this test's alone; ``on_setup_failure(message)`` when the
    script that makes it fails (a skip or a failure, as the caller decides)."""
    with login_user_alone():
        try:
            user = pwd.getpwnam(USER)
        except KeyError:  # the script makes the user (and its venv)
            done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                on_setup_failure(f"{SETUP.name} failed ({done.returncode}): {done.stderr[-3000:]}")
            user = pwd.getpwnam(USER)
        yield user


@contextlib.contextmanager
def shared_sticky_dir(prefix: str):
    """A directory both users may write to, sticky, as /tmp (pytest's tmp_path is root's, mode 700)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
