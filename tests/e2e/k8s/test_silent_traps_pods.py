"""Issue 51's missing program on real pods (marker ``real_pods``): the image's files are not this
machine's, so the first worker pod is asked through the job's exec channel before mpirun starts,
by this mpilaunch (``--launcher local``) or by the launcher pod, which carries its error back as
one signed line (core/launcher_lines.py). One error line and its hint, exit 2, no rank started,
nothing left."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real_pods


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpilaunch: error: ")]


@pytest.mark.parametrize("launcher", ["local", "cluster"])
def test_silent_trap_pods_missing_program_is_refused_before_mpirun(real, launcher):
    job = f"st-pods-{launcher}"
    p = real.run(job, "--np", "2", "--slots-per-worker", "1", "--launcher", launcher, "--", "no-such-program-51")
    assert p.returncode == 2, p.stderr[-3000:]
    assert errors(p.stderr) == [
        f"mpilaunch: error: the program 'no-such-program-51' is not on the ranks' PATH on worker {job}-worker-0"
    ], p.stderr[-3000:]
    assert "  hint: check its name" in p.stderr
    assert "cannot start" not in p.stdout + p.stderr, p.stderr[-3000:]  # no rank ran
    assert real.leftovers(job) == [], p.stderr[-2000:]


def test_silent_trap_pods_missing_script_names_the_directory_the_ranks_start_in(real):
    # this machine's directory does not exist in the image: the ranks start in the pod's $HOME
    job = "st-pods-script"
    p = real.run(job, "--np", "2", "--slots-per-worker", "2", "--launcher", "local", "--", "python3", "train_51.py")
    assert p.returncode == 2, p.stderr[-3000:]
    (line,) = errors(p.stderr)
    assert line.startswith(
        f"mpilaunch: error: the Python script train_51.py does not exist on worker {job}-worker-0 (in /"
    ), line
    assert real.leftovers(job) == [], p.stderr[-2000:]
