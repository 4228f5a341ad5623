"""The timeline page's model and drawing, from a report alone (mpilaunch/job/timeline.py, timeline_page.py).

The pages of real jobs, loaded in Chromium, are tests/e2e/local/test_timeline_page.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser

from mpilaunch.core import phases
from mpilaunch.job import timeline, timeline_page
from support.helpers import REPO, mpilaunch_env

PHASES = {
    "allocated": 0.3,
    "pods_scheduled": 1.0,
    "containers_running": 4.0,
    "workers_ready": 5.0,
    "mpirun_started": 5.1,
    "first_rank_start": 6.0,
    "ranks_done": 9.0,
    "workload_done": 9.2,
    "released": 10.0,
}
WORKERS = {
    "j-worker-0": {"created": 0.3, "scheduled": 0.5, "running": 3.0, "ready": 4.0},
    "j-worker-1": {"created": 0.3, "scheduled": 1.0, "running": 4.0, "ready": 5.0},
}


def ranks(*runs):
    """ranks[] of a report started at 12:00:00.000: (rank, worker, start s, end s or None, exit code)."""
    out = []
    for rank, worker, start, end, code in runs:
        r = {"rank": rank, "worker": worker, "exit_code": code, "started_at": f"2026-12-07T12:00:{start:06.3f}Z"}
        if end is not None:
            r["ended_at"] = f"2026-12-07T12:00:{end:06.3f}Z"
        out.append(r)
    return out


def report(**over):
    base = {
        "job": "j",
        "mode": "mpirun",
        "backend": "k8s",
        "exit_code": 0,
        "failure": None,
        "started_at": "2026-12-07T12:00:00.000Z",
        "plan": {"ranks": 4, "gpus": 0, "workers": [{"name": "j-worker-0"}, {"name": "j-worker-1"}]},
        "timings": {"phases": PHASES, "workers": WORKERS},
        "ranks": ranks(
            (0, "j-worker-0", 6.0, 9.0, 0),
            (1, "j-worker-0", 6.1, 8.5, 0),
            (2, "j-worker-1", 6.2, 8.9, 0),
            (3, "j-worker-1", 6.3, 8.8, 0),
        ),
    }
    return {**base, **over}


def bars(m, kind=None, cls=None):
    return [b for row in m["rows"] if kind in (None, row["kind"]) for b in row["bars"] if cls in (None, b["cls"])]


def x_of(seconds):
    return round(timeline.LEFT + seconds * (timeline.WIDTH - timeline.LEFT - timeline.RIGHT) / 10.0, 1)


def test_timeline_page_one_bar_per_rank_placed_on_the_time_axis():
    m = timeline.model(report())
    rank_rows = [row for row in m["rows"] if row["kind"] == "rank"]
    assert [row["label"] for row in rank_rows] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert [len(row["bars"]) for row in rank_rows] == [1, 1, 1, 1]
    first = rank_rows[0]["bars"][0]
    assert (first["x"], first["cls"]) == (x_of(6.0), "ok")
    assert abs(first["x"] + first["w"] - x_of(9.0)) <= 0.2
    assert "rank 0: 6.00s to 9.00s (3.00s), exit 0" == first["title"]
    # rows in plan order: each worker, then its ranks
    assert [row["label"] for row in m["rows"]][:5] == ["launch", "j-worker-0", "rank 0", "rank 1", "j-worker-1"]


def test_timeline_page_worker_phases_become_segments():
    m = timeline.model(report())
    worker_rows = {row["label"]: row["bars"] for row in m["rows"] if row["kind"] == "worker"}
    segments = [(b["cls"], b["start"], b["end"]) for b in worker_rows["j-worker-1"]]
    assert segments == [("queue", 0.3, 1.0), ("pull", 1.0, 4.0), ("agent", 4.0, 5.0), ("held", 5.0, 10.0)]
    # a backend that sees only created and ready (local, ssh): one start segment, then held
    local = report(timings={"phases": PHASES, "workers": {"j-worker-0": {"created": 0.2, "ready": 0.25}}})
    row = next(r for r in timeline.model(local)["rows"] if r["label"] == "j-worker-0")
    assert [(b["cls"], b["start"], b["end"]) for b in row["bars"]] == [("agent", 0.2, 0.25), ("held", 0.25, 10.0)]
    assert {item["cls"] for item in timeline.model(report())["legend"]} >= {"queue", "pull", "agent", "held", "ok"}


def test_timeline_page_rank_outcomes_and_a_rank_that_never_started():
    r = report(
        exit_code=7,
        ranks=ranks((0, "j-worker-0", 6.0, 7.0, 7), (1, "j-worker-0", 6.1, None, None), (2, "j-worker-1", 6.2, 9.0, 0))
        + [{"rank": 3, "worker": "j-worker-1", "exit_code": None}],
    )
    m = timeline.model(r)
    by_rank = {b["rank"]: b for b in bars(m, "rank")}
    assert by_rank[0]["cls"] == "failed" and by_rank[0]["title"].endswith("exit 7")
    assert by_rank[1]["cls"] == "unended" and by_rank[1]["end"] == PHASES["workload_done"]
    assert 3 not in by_rank
    assert next(row for row in m["rows"] if row["label"] == "rank 3")["note"] == "never started"


def test_timeline_page_attempts_and_earlier_runs():
    attempts = [
        {
            "attempt": 1,
            "started_s": 5.0,
            "ended_s": 7.0,
            "exit_code": 3,
            "failure": "rank 1 exited with code 3",
            "ranks": [[0, 5.5, 6.9, 143], [1, 5.6, 6.0, 3], [2, 5.7, None, None]],
        },
        {"attempt": 2, "started_s": 7.0, "ended_s": 9.2, "exit_code": 0, "failure": None, "ranks": []},
    ]
    m = timeline.model(report(attempts=attempts))
    earlier = {b["rank"]: b for b in bars(m, "rank") if b["cls"].startswith("earlier")}
    assert earlier[1]["cls"] == "earlier-failed" and earlier[1]["title"].endswith("exit 3")
    assert earlier[2]["cls"] == "earlier" and earlier[2]["end"] == 7.0  # no exit seen: until the attempt ended
    assert len([b for b in bars(m, "rank") if not b["cls"].startswith("earlier")]) == 4
    bands = [b for b in m["bands"] if b["cls"] == "attempt"]
    assert [b["label"] for b in bands] == ["attempt 1: exit 3", "attempt 2: exit 0"]
    assert bands[0]["title"] == "rank 1 exited with code 3"
    assert m["rows"][0]["kind"] == "marks"  # the bands' labels get a row of their own


def test_timeline_page_hang_and_timeout_are_marked():
    r = report(
        timings={"phases": {**PHASES, "hang_found": 8.0, "timed_out": 9.0}, "workers": WORKERS},
        hang={"verdict": "mpilaunch: hang: rank 2 is stuck in MPI_Allreduce", "stall_timeout_s": 1.5},
    )
    m = timeline.model(r)
    [hang] = [b for b in m["bands"] if b["cls"] == "hang"]
    assert (hang["x"], round(hang["x"] + hang["w"], 1)) == (x_of(6.5), x_of(8.0))
    assert hang["title"].startswith("mpilaunch: hang: rank 2")
    [line] = m["lines"]
    assert (line["cls"], line["x"]) == ("timeout", x_of(9.0))
    assert {"hang", "timeout"} <= {item["cls"] for item in m["legend"]}


def test_timeline_page_replaced_worker_shows_both_incarnations():
    times = {"j-worker-1": {"created": 0.3, "ready": 1.0}}
    phases.retire_worker(times, "j-worker-1", 1)
    phases.mark_worker(times, "j-worker-1", "created", 6.0)
    phases.mark_worker(times, "j-worker-1", "ready", 7.0)
    assert times == {"j-worker-1": {"created#1": 0.3, "ready#1": 1.0, "created": 6.0, "ready": 7.0}}
    m = timeline.model(report(timings={"phases": PHASES, "workers": times}))
    row = next(r for r in m["rows"] if r["label"] == "j-worker-1")
    assert [(b["cls"], b["start"], b["end"]) for b in row["bars"]] == [
        ("agent", 0.3, 1.0),
        ("held", 1.0, 6.0),  # until its replacement was created
        ("agent", 6.0, 7.0),
        ("held", 7.0, 10.0),
    ]


def test_timeline_page_axis_ticks_are_round():
    assert timeline.tick_step(10.0) == 1.0
    assert timeline.tick_step(2.98) == 0.5
    assert timeline.tick_step(3600.0) == 500.0
    assert timeline.tick_step(0.05) == 0.005
    ticks = timeline.axis(2.98, 100.0)
    assert [t["label"] for t in ticks] == ["0.0s", "0.5s", "1.0s", "1.5s", "2.0s", "2.5s"]
    assert timeline.iso_seconds("2026-12-07T12:00:01.250Z") - timeline.iso_seconds("2026-12-07T12:00:00.000Z") == 1.25
    assert timeline.iso_seconds("garbage") is None


class Parsed(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.scripts, self.links = [], 0, 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.scripts += tag == "script"
        self.links += tag in ("link", "img", "iframe") or any(k in ("src", "href") for k, _ in attrs)


def test_timeline_page_is_self_contained_and_escapes():
    r = report(job="<script>alert(1)</script>", failure="a & b")
    text = timeline_page.page(timeline.model(r))
    parsed = Parsed()
    parsed.feed(text)
    assert parsed.scripts == 0 and parsed.links == 0  # nothing to run, nothing to fetch
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    rank_bars = [a for tag, a in parsed.tags if tag == "rect" and "rank-bar" in a.get("class", "").split()]
    assert sorted(int(a["data-rank"]) for a in rank_bars) == [0, 1, 2, 3]
    assert "mpilaunch: job &lt;script&gt;alert(1)&lt;/script&gt; succeeded in 10.0s" in text  # the summary on top


def report_cmd(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=mpilaunch_env(MPILAUNCH_STATE_DIR=str(tmp_path / "state")),
    )


def test_timeline_page_bad_input_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**report(), "exit_code": 0}))
    two = report_cmd(tmp_path, str(path), str(path), "--html", str(tmp_path / "t.html"))
    assert two.returncode == 2 and two.stderr.startswith("mpilaunch: error: --html draws one record"), two.stderr
    nowhere = report_cmd(tmp_path, str(path), "--html", str(tmp_path / "no-such-dir" / "t.html"))
    assert nowhere.returncode == 2 and nowhere.stderr.startswith("mpilaunch: error: cannot write "), nowhere.stderr
    assert "hint:" in nowhere.stderr and "Traceback" not in nowhere.stderr
    assert list(tmp_path.iterdir()) == [path]  # nothing written, no temporary file left
    made = report_cmd(tmp_path, str(path), "--html", str(tmp_path / "t.html"))
    assert made.returncode == 0 and (tmp_path / "t.html").read_text().startswith("<!DOCTYPE html>")


def test_timeline_page_k8s_pod_phases_from_the_pods_status():
    from mpilaunch.backends.k8s.pods import pod_phases

    pending = {"spec": {}, "status": {"phase": "Pending"}}
    bound = {"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}
    running = {"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "conditions": []}}
    ready = {
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert [pod_phases(p) for p in (None, pending, bound, running, ready)] == [
        [],
        ["created"],
        ["created", "scheduled"],
        ["created", "scheduled", "running"],
        ["created", "scheduled", "running", "ready"],
    ]
    times: dict = {}
    for at, pod in enumerate((pending, bound, bound, running, ready)):  # polled: the first sight counts
        for phase in pod_phases(pod):
            phases.mark_worker(times, "w", phase, float(at))
    assert times == {"w": {"created": 0.0, "scheduled": 1.0, "running": 3.0, "ready": 4.0}}


def test_timeline_page_draws_a_rank_whose_worker_is_not_in_the_plan():
    """kwok's exec and a rank that never said where it ran report worker "?": still one bar, under "?"."""
    m = timeline.model(report(ranks=ranks((0, "j-worker-0", 6.0, 9.0, 0), (1, "?", 6.1, 9.0, 0))))
    assert sorted(b["rank"] for b in bars(m, "rank")) == [0, 1]
    assert [row["label"] for row in m["rows"] if row["kind"] == "worker"] == ["j-worker-0", "j-worker-1", "?"]


def test_timeline_page_of_8192_ranks_stays_drawable():
    """1024 workers x 8 ranks: every rank still one bar, rows thinned so the page stays a page."""
    workers = [{"name": f"w{i}"} for i in range(1024)]
    runs = [(r, f"w{r // 8}", 6.0, 9.0, 0) for r in range(8192)]
    m = timeline.model(report(plan={"ranks": 8192, "gpus": 0, "workers": workers}, ranks=ranks(*runs)))
    assert len(bars(m, "rank")) == 8192
    assert {row["h"] for row in m["rows"] if row["kind"] == "rank"} == {timeline.RANK_ROW_HUGE}
    assert m["height"] < 1024 * timeline.ROW + 8192 * 4
    text = timeline_page.page(m)
    assert text.count("rank-bar") == 8192 and len(text) < 4_000_000


def test_timeline_page_hang_band_starts_when_the_output_stopped():
    """--on-stall report then --timeout: the timeout's stacks replace report.json's hang (no
    stall_timeout_s); the "stalled" phase still says where the silence began."""
    r = report(timings={"phases": {**PHASES, "stalled": 6.2, "hang_found": 8.0, "timed_out": 9.0}, "workers": WORKERS})
    [hang] = timeline.model(r)["bands"]
    assert (hang["x"], round(hang["x"] + hang["w"], 1)) == (x_of(6.2), x_of(8.0))
    assert hang["title"] == "no output for 1.8s, then declared hung"
