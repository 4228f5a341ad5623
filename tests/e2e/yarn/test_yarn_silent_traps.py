"""Issue 51's missing program on YARN: the containers' files are the NodeManagers', not this
machine's, so the first worker is asked before mpirun starts (by this mpilaunch, or by the
launcher container, which runs the same lifecycle). One error line, exit 2, nothing left."""

from __future__ import annotations

import pytest

from support.yarn import app_by_name, assert_released, start

pytestmark = pytest.mark.yarn


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_silent_trap_missing_program_in_the_containers_is_refused_before_mpirun(yarn, openmpi_env, launcher):
    name = f"yarn-noprog-{launcher}"
    proc = start(
        ["--name", name, "--launcher", launcher, "--np", "2", "--slots-per-worker", "1", "--memory", "256 MiB"]
        + ["--", "no-such-program-51"],
        openmpi_env,
    )
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("mpilaunch: error: ")]
    assert said == [
        f"mpilaunch: error: the program 'no-such-program-51' is not on the ranks' PATH on worker {name}-worker-0"
    ], err[-3000:]
    assert err.splitlines()[err.splitlines().index(said[0]) + 1].startswith("  hint: check its name"), err[-3000:]
    assert "cannot start" not in out + err, err[-3000:]  # no rank ran
    assert_released(yarn, name, app_by_name(yarn, name)["finalStatus"])
