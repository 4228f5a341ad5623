"""A YARN job's timeline page: each worker container's own phases, one bar per rank, in Chromium.

The worker containers' phases come from the submitting side's wait for them
(``timings.workers``: ``created`` when the application was submitted,
``running`` when the ApplicationMaster listed the container running,
``ready`` when its agent answered). The page and the browser check are
tests/e2e/local/test_timeline_page.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.browser import Rects, browse, needs_chromium
from support.helpers import REPO

pytestmark = pytest.mark.yarn


@needs_chromium
def test_timeline_page_of_a_yarn_job_in_chromium(yarn, openmpi_env, tmp_path):
    name, state, page = "yarn-timeline", tmp_path / "state", tmp_path / "timeline.html"
    env = {**openmpi_env["env"], "MPILAUNCH_STATE_DIR": str(state)}
    run = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--mpirun", openmpi_env["mpirun"], "--name", name,
         "--memory", "256 MiB", "--np", "4", "--slots-per-worker", "2", "-q", "--", sys.executable, "-c", "pass"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    [path] = (state / "runs").glob(f"{name}-*/report.json")
    report = json.loads(path.read_text())
    seen = report["timings"]["workers"]
    assert sorted(seen) == [f"{name}-worker-0", f"{name}-worker-1"], seen
    for worker, phases in seen.items():
        assert list(phases) == ["created", "running", "ready"], (worker, phases)
        assert phases["ready"] <= report["timings"]["phases"]["workers_ready"], (worker, phases)

    made = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "report", str(path), "--html", str(page)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    dom, console = browse(page, tmp_path / "chromium-profile")
    assert console == [], console
    rects = Rects(dom)
    assert sorted(int(b["data-rank"]) for b in rects.with_class("rank-bar")) == [0, 1, 2, 3]
    assert len(rects.with_class("pull")) == 2 and len(rects.with_class("held")) == 2  # each container's start
