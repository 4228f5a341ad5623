"""What a plain launch's CLI imports: nothing of the features the job did not ask for (issue 53 item 4).

Every Python start is on a launch's critical path (two cores, seven interpreters). Features added
since the first measure (the preflight, spares, straggler reports, the hang verdict, --collect)
were imported by every launch, job or not: 23 modules and ~25 ms of CPU of a 4-rank job
(BENCHMARKS.md, "End-to-end launch"). A real job is run here with mpilaunch's own entry point, and
the CLI process writes the modules it holds as it exits; a job that asks for --preflight shows
the same record names the modules it did not find in the plain job.
"""

import json
import sys

import pytest

from support.helpers import REPO, mpilaunch_env
from support.mpi_installs import checked, installs

pytestmark = pytest.mark.mpi

# the modules a local job without --preflight, --spares, --straggler-report, --stall-timeout, --timeout
# and --collect has no use for (the standard library's ones: what only those features import)
OPTIONAL = (
    "mpilaunch.preflight",
    "mpilaunch.workloads.preflight_run",
    "mpilaunch.hang.verdict",
    "mpilaunch.hang.collect",
    "mpilaunch.hang.stall",
    "mpilaunch.hang.stragglers",
    "statistics",
    "pkgutil",
    "typing",
    # TLS: the local agents are on Unix sockets, MAC-authenticated (agent_credential.new_mac_secret)
    "cryptography",
    "mpilaunch.wire.tls_session",
)

# the CLI as `python -m mpilaunch` runs it, and, at its exit (its own process only: the forked
# agents exit through os._exit), the names of the modules it imported
RUN_AND_LIST = (
    "import atexit, json, os, runpy, sys\n"
    "out, me = sys.argv.pop(1), os.getpid()\n"
    "def dump():\n"
    "    if os.getpid() == me:\n"
    "        with open(out, 'w') as f:\n"
    "            json.dump(sorted(sys.modules), f)\n"
    "atexit.register(dump)\n"
    "sys.argv[0] = 'mpilaunch'\n"
    "runpy.run_module('mpilaunch', run_name='__main__', alter_sys=True)\n"
)


def imported_by_a_launch(tmp_path, install, *options) -> set[str]:
    import subprocess

    listing = tmp_path / f"modules{len(options)}.json"
    argv = [sys.executable, "-c", RUN_AND_LIST, str(listing), "--mpirun", install.mpirun, "-q", *options]
    argv += ["--np", "4", "--slots-per-worker", "2", "--", sys.executable, "-c", "pass"]
    env = mpilaunch_env(install, MPILAUNCH_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return set(json.loads(listing.read_text()))


def test_a_plain_launch_imports_no_optional_feature(tmp_path):
    install = checked(installs()["openmpi5"])
    plain = imported_by_a_launch(tmp_path, install)
    assert "mpilaunch.workloads.mpirun" in plain  # the listing is the launch's
    found = sorted(m for m in plain if m in OPTIONAL or m.startswith("mpilaunch.preflight."))
    assert found == [], f"a plain launch imported {found}"
    # the same listing sees a feature's modules when the job asks for it
    checked_first = imported_by_a_launch(tmp_path, install, "--preflight", "report")
    assert {"mpilaunch.workloads.preflight_run", "mpilaunch.preflight"} <= checked_first
