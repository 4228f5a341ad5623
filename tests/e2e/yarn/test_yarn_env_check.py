"""The environment check names what a worker changed (issue 42): a YARN worker container whose
Python startup file (sitecustomize) sets two forwarded variables otherwise than mpilaunch sent.

A rank wrapper there runs as ``python -m mpilaunch.rank``, so the container's Python startup
runs first (the local and ssh backends' wrappers run isolated, ``-IS``: nothing of the worker's
can act there). The warning and report.json name each variable, on that worker's ranks only,
with both values, a token's masked as ``render`` masks it; Open MPI's own <prefix>/lib ahead of
every rank's LD_LIBRARY_PATH is not named.
"""

from __future__ import annotations

import json
import sys

import pytest

from mpilaunch.core import mpi
from support.yarn import assert_released, describe_app, start

pytestmark = pytest.mark.yarn

STARTUP_FILE = """\
import os
# a site's Python startup file on one worker only: it runs in the rank wrapper before the program
if os.environ.get("MPILAUNCH_WORKER", "").endswith("-worker-1") and "MPILAUNCH_STATUS_TOKEN" in os.environ:
    os.environ["LD_LIBRARY_PATH"] = "/opt/site/lib:" + os.environ.get("LD_LIBRARY_PATH", "")
    os.environ["HF_TOKEN"] = "hf_set_by_the_worker"
"""

# What each rank's program saw of LD_LIBRARY_PATH.
PRINT_LD_LIBRARY_PATH = (
    "import os; print('LDLP', os.environ['OMPI_COMM_WORLD_RANK'], os.environ.get('LD_LIBRARY_PATH'), flush=True)"
)


def test_yarn_env_check_names_what_a_workers_startup_file_changed(yarn, openmpi_env, tmp_path):
    # --launcher local: with the cluster launcher the check runs in the launcher container, and
    # neither its warning nor report.json's environment reaches this side (not yet carried over)
    name, launcher = "yarn-envcheck", "local"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STARTUP_FILE)
    out = tmp_path / "out"
    secret = "hf_job_secret_0123456789"
    proc = start(
        [
            "--name",
            name,
            "--launcher",
            launcher,
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--memory",
            "512 MiB",
            "--vcores",
            "2",
            "--output-dir",
            str(out),
            "-x",
            "LD_LIBRARY_PATH=/opt/job/lib",
            "-x",
            "HF_TOKEN",
            "--",
            sys.executable,
            "-c",
            PRINT_LD_LIBRARY_PATH,
        ],
        openmpi_env,
        {"HF_TOKEN": secret, "PYTHONPATH": str(site)},
    )
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout + stderr + describe_app(yarn, name)
    seen = {
        int(r): v for r, v in (line.split("LDLP ", 1)[1].split() for line in stdout.splitlines() if "LDLP " in line)
    }
    launcher_rewrite = seen[0]  # worker 0: what was sent, behind Open MPI's <prefix>/lib where it put one
    assert launcher_rewrite.split(":")[-1] == "/opt/job/lib" and seen[1] == launcher_rewrite, seen
    assert seen[2] == seen[3] == "/opt/site/lib:" + launcher_rewrite, seen
    env = json.loads((out / "report.json").read_text())["environment"]
    assert env["env_digest_differs"] == [2, 3]
    assert env["env_differs"] == [
        {"variable": "HF_TOKEN", "sent": mpi.mask(secret), "seen": mpi.mask("hf_set_by_the_worker"), "ranks": [2, 3]},
        {"variable": "LD_LIBRARY_PATH", "sent": "/opt/job/lib", "seen": seen[2], "ranks": [2, 3]},
    ]
    warning = stderr[stderr.index("mpilaunch: warning: 2 rank(s) (2-3) saw other values") :].splitlines()
    assert warning[1:3] == [
        f"  HF_TOKEN: ranks 2-3 saw '{mpi.mask('hf_set_by_the_worker')}'; mpilaunch sent '{mpi.mask(secret)}'",
        f"  LD_LIBRARY_PATH: ranks 2-3 saw '{seen[2]}'; mpilaunch sent '/opt/job/lib'",
    ], stderr
    everything = stdout + stderr + (out / "report.json").read_text()
    assert secret not in everything and "hf_set_by_the_worker" not in everything
    assert_released(yarn, name, "SUCCEEDED")
