"""--collect on YARN: the files the ranks wrote in their containers' directories come back through
the workers' agents (the channel the stacks of a hung job take), before the application ends.

4 ranks on 2 worker containers (tests/programs/write_files.py: ``results/rank-<R>.json`` in each
rank's working directory). With the cluster launcher a rank fails; with mpirun here the job runs
past --timeout. Either way the submitting mpilaunch holds the job's secret and the agents'
addresses and collects, each container's files under its worker's name. Open MPI 5.

Where the ranks run is Open MPI's choice: mpirun's directory where the worker has it, and on this
one-machine testbed every container has the job's directory (the submitting one, which the
launcher container takes over): the ranks of both workers write there, and both workers bring
back the same four files. On a cluster the ranks run in their containers' directories; either
way their start lines say where, and relative globs start there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.helpers import PROGRAMS, REPO
from support.yarn import assert_released, describe_app

pytestmark = pytest.mark.yarn

PROGRAM = str(PROGRAMS / "write_files.py")


def tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("launcher,mode", [("cluster", "fail"), ("local", "sleep")])
def test_yarn_collect_files_after_a_failed_rank_and_a_timeout(yarn, openmpi_env, tmp_path, launcher, mode):
    name = f"yarn-collect-{mode}"
    out = tmp_path / "out"
    args = ["--name", name, "--launcher", launcher, "--np", "4", "--slots-per-worker", "2", "--memory", "512 MiB"]
    args += ["--output-dir", str(out), "--collect", "results/*.json"]
    args += ["--timeout", "25" if mode == "sleep" else "300", "--", sys.executable, PROGRAM, mode]
    job = tmp_path / "job"  # the ranks' directory (above): not this checkout
    job.mkdir()
    env = {**openmpi_env["env"], "PYTHONPATH": os.pathsep.join([str(REPO), openmpi_env["env"].get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--mpirun", openmpi_env["mpirun"], *args]
    proc = subprocess.Popen(cmd, cwd=job, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == (7 if mode == "fail" else EXIT_TIMEOUT), stdout + stderr + describe_app(yarn, name)
    files = tree(out / "files")
    collected = json.loads((out / "report.json").read_text())["collected"]
    assert [line for line in stderr.splitlines() if line.startswith("mpilaunch: collect:")] == [], stderr
    written = sorted(os.listdir(job / "results"))
    if mode == "fail":  # the failing rank's file at least (the others may have been stopped before theirs)
        assert "rank-1.json" in written, stderr
    else:
        assert written == [f"rank-{r}.json" for r in range(4)], stderr
    # each worker's listing, under its name: here both list the one directory (above)
    assert files == sorted(f"{name}-worker-{w}/results/{f}" for w in (0, 1) for f in written), stderr
    for f in files:
        rank = json.loads((out / "files" / f).read_text())
        assert rank["cwd"] == str(job) and f == f"{f.split('/')[0]}/results/rank-{rank['rank']}.json", (f, rank)
        assert rank["worker"] == f"{name}-worker-{rank['rank'] // 2}", rank
    assert collected["files"] == len(files) and collected["dir"] == str(out / "files"), collected
    assert f"collected: {len(files)} files" in stderr, stderr
    assert_released(yarn, name, "FAILED")
