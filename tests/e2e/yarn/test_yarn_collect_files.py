"""--collect on YARN: the files the ranks wrote in their containers' directories come back through
the workers' agents (the channel the stacks of a hung job take), before the application ends.

4 ranks on 2 worker containers (tests/programs/write_files.py: ``results/rank-R.json`` in each
rank's directory, the container's). With the cluster launcher a rank fails; with mpirun here the
job runs past --timeout. Either way the submitting mpilaunch holds the job's secret and the
agents' addresses and collects, each container's files under its worker's name. Open MPI 5.
"""

from __future__ import annotations

import json
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.helpers import PROGRAMS
from support.yarn import assert_released, describe_app, start

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
    proc = start(args, openmpi_env)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == (3 if mode == "fail" else EXIT_TIMEOUT), stdout + stderr + describe_app(yarn, name)
    files = tree(out / "files")
    collected = json.loads((out / "report.json").read_text())["collected"]
    assert [line for line in stderr.splitlines() if line.startswith("mpilaunch: collect:")] == [], stderr
    if mode == "fail":  # the failing rank's file at least (the others may have been stopped before theirs)
        assert f"{name}-worker-0/results/rank-1.json" in files, stderr + str(files)
    else:  # each container's own files, under its worker's name
        assert files == [f"{name}-worker-{r // 2}/results/rank-{r}.json" for r in range(4)], stderr
    for f in files:
        rank = json.loads((out / "files" / f).read_text())
        assert f.startswith(rank["worker"] + "/"), (f, rank)
    assert collected["files"] == len(files) and collected["dir"] == str(out / "files"), collected
    assert f"collected: {len(files)} files" in stderr, stderr
    assert_released(yarn, name, "FAILED")
