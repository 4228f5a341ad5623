"""`mpilaunch report NAME --html FILE` in a real browser: Debian's Chromium, headless.

Real Open MPI jobs on the local backend write their records; the page drawn
from each is loaded with ``chromium --headless --dump-dom`` and its console
read from ``--enable-logging=stderr``: the page has no script, so any
console line at all (an SVG attribute Chromium rejects, a resource it
could not load) is a fault. The DOM Chromium built is then counted: one rank
bar per rank. A control page with a known console error checks that the
console is read at all. ``scripts/test`` installs Chromium (apt).

The page model itself is tests/unit/test_timeline_page_model.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mpilaunch.core.exit_codes import EXIT_TIMEOUT
from support.browser import Rects, browse, needs_chromium
from support.helpers import REPO, mpilaunch_env, run_mpilaunch

pytestmark = pytest.mark.mpi

ATTEMPTS = str(REPO / "tests/programs/attempts.py")


def timeline(state, name: str, page) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "report", name, "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=mpilaunch_env(MPILAUNCH_STATE_DIR=str(state)),
    )


def rank_bars(dom: str) -> list[dict]:
    return Rects(dom).with_class("rank-bar")


@needs_chromium
def test_timeline_page_console_is_read(tmp_path):
    """The control: a page with a console error and an SVG attribute Chromium rejects shows both."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><script>console.error("boom")</script>'
        '<svg><rect class="bar rank-bar" width="-1" height="2"/></svg></body></html>'
    )
    dom, console = browse(page, tmp_path / "chromium-profile")
    assert any("boom" in line for line in console), console
    assert any("negative value" in line for line in console), console
    assert len(rank_bars(dom)) == 1


@needs_chromium
def test_timeline_page_of_a_real_job_in_chromium(openmpi5, tmp_path):
    state, page = tmp_path / "state", tmp_path / "timeline.html"
    proc = run_mpilaunch(
        [
            "--name",
            "tl-four",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "-q",
            "--",
            sys.executable,
            "-c",
            "import os, time; time.sleep(0.3 + 0.1 * int(os.environ['OMPI_COMM_WORLD_RANK']))",
        ],
        openmpi5,
        env_extra={"MPILAUNCH_STATE_DIR": str(state)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = timeline(state, "tl-four", page)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("mpilaunch: timeline of job tl-four (") and str(page) in made.stdout

    dom, console = browse(page, tmp_path / "chromium-profile")
    assert console == [], console
    bars = rank_bars(dom)
    assert sorted(int(b["data-rank"]) for b in bars) == [0, 1, 2, 3], bars
    assert all("ok" in b["class"].split() and float(b["width"]) >= 1 for b in bars), bars
    assert "mpilaunch: job tl-four succeeded in" in dom  # the summary line at the top
    parser = Rects(dom)
    assert len(parser.with_class("held")) == 2  # each worker's bar: ready, held until released
    [report] = [json.loads(p.read_text()) for p in (state / "runs").glob("tl-four-*/report.json")]
    assert sorted(report["timings"]["workers"]) == ["tl-four-worker-0", "tl-four-worker-1"]


@needs_chromium
def test_timeline_page_of_two_attempts_in_chromium(openmpi5, tmp_path):
    """--retries 1 --retry-rank-failures, rank 1 failing the first time: one rank bar per rank (the
    last attempt's), the first attempt's runs faded beside them, both attempts marked."""
    state, page = tmp_path / "state", tmp_path / "timeline.html"
    proc = run_mpilaunch(
        [
            "--name",
            "tl-again",
            "--np",
            "4",
            "--slots-per-worker",
            "2",
            "--retries",
            "1",
            "--retry-rank-failures",
            "-q",
            "--",
            sys.executable,
            ATTEMPTS,
        ],
        openmpi5,
        env_extra={
            "MPILAUNCH_STATE_DIR": str(state),
            "ATTEMPT_MARKER": str(tmp_path / "marker"),
            "FAIL_UNIT": "1",
            "FAIL_CODE": "3",
            "SLEEP": "0.5",
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = timeline(state, "tl-again", page)
    assert made.returncode == 0, made.stderr

    dom, console = browse(page, tmp_path / "chromium-profile")
    assert console == [], console
    parser = Rects(dom)
    bars = parser.with_class("rank-bar")
    assert sorted(int(b["data-rank"]) for b in bars) == [0, 1, 2, 3], bars
    earlier = {int(b["data-rank"]) for b in parser.with_class("attempt-rank")}
    assert 1 in earlier and earlier <= {0, 1, 2, 3}, earlier  # rank 1 failed; mpirun ended the others
    assert len(parser.with_class("attempt")) == 2
    assert "attempt 1: exit 3" in dom and "attempt 2: exit 0" in dom


@needs_chromium
def test_timeline_page_marks_a_hang_and_the_timeout(openmpi5, tmp_path):
    """A job that hangs (tests/programs/hang.py: rank 2 sleeps, the others wait in MPI_Allreduce),
    reported by --stall-timeout and run on to --timeout: its page shows the hang's band, ending when it
    was declared, and the timeout's line, and still one bar per rank (no exit seen: grey)."""
    state, page = tmp_path / "state", tmp_path / "timeline.html"
    proc = run_mpilaunch(
        ["--name", "tl-hang", "--np", "4", "--slots-per-worker", "2", "--stall-timeout", "4", "--on-stall", "report",
         "--timeout", "12", "-q", "--", sys.executable, str(REPO / "tests/programs/hang.py"), "sleep", "2"],
        openmpi5,
        env_extra={"MPILAUNCH_STATE_DIR": str(state)},
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == EXIT_TIMEOUT, proc.stderr[-3000:]
    [path] = (state / "runs").glob("tl-hang-*/report.json")
    phases = json.loads(path.read_text())["timings"]["phases"]
    assert phases["first_rank_start"] < phases["hang_found"] < phases["timed_out"], phases
    made = timeline(state, "tl-hang", page)
    assert made.returncode == 0, made.stderr

    dom, console = browse(page, tmp_path / "chromium-profile")
    assert console == [], console
    rects = Rects(dom)
    assert sorted(int(b["data-rank"]) for b in rects.with_class("rank-bar")) == [0, 1, 2, 3]
    [hang] = [r for r in rects.with_class("band") if "hang" in r["class"].split()]
    assert 'class="timeout"' in dom and ">--timeout<" in dom
    assert float(hang["width"]) > 1
