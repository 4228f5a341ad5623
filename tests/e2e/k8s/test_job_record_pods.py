"""The record of a job on real pods names the image the pods ran and its digest (the pods' status
``imageID``), and the node: what a benchmark team needs to tell two runs' software apart."""

import json
import os
import subprocess

import pytest

from mpilaunch.job import timeline
from support.helpers import REPO

pytestmark = pytest.mark.real_pods


def test_job_record_keeps_the_image_and_its_digest_on_real_pods(real, tmp_path):
    job = "rp-record"
    proc = subprocess.run(
        real.argv(job, "--np", "2", "-q", "--", "python3", "-c", "pass"),
        cwd=REPO,
        env=real.env(MPILAUNCH_STATE_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = os.listdir(tmp_path / "runs")
    path = tmp_path / "runs" / run_dir / "report.json"
    assert proc.stderr.rstrip().endswith(f"; record: {path}"), proc.stderr[-2000:]
    report = json.loads(path.read_text())
    assert report["image"] == real.image
    assert report["image_digest"].startswith("sha256:") and len(report["image_digest"]) == 71, report["image_digest"]
    workers = report["workers"].values()
    assert {w["image_id"].rsplit("@", 1)[-1] for w in workers} == {report["image_digest"]}
    assert report["nodes"] == sorted({w["node"] for w in workers}) and report["nodes"][0]
    # each pod's own start-up, as the timeline page draws it: created, bound, running, ready, in order
    seen = report["timings"]["workers"]
    assert sorted(seen) == sorted(report["workers"]), seen
    for worker, phases in seen.items():
        assert list(phases) == ["created", "scheduled", "running", "ready"], (worker, phases)
        assert report["timings"]["phases"]["allocated"] - 0.5 <= phases["created"], (worker, phases)
        assert phases["ready"] <= report["timings"]["phases"]["workers_ready"], (worker, phases)
    rows = [r for r in timeline.model(report)["rows"] if r["kind"] == "worker"]
    assert [[b["cls"] for b in r["bars"]][-1] for r in rows] == ["held"] * len(rows), rows
    assert real.leftovers(job) == []
