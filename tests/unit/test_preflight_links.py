"""--preflight's link test, judged (preflight/checks.py judge_links) and read back from mpirun's
output (workloads/preflight_links.py parse). The probe itself runs under real MPIs in
tests/e2e/local/test_preflight.py and over a slowed link in tests/e2e/ssh/test_ssh_preflight.py."""

from __future__ import annotations

import json

import pytest

from mpilaunch.preflight import checks, link_probe
from mpilaunch.workloads import preflight_links

MIB = 1 << 20


def rows(edge_seconds: list[float], allreduce_s: float = 0.002) -> dict[int, dict]:
    return {
        i: {"rank": i, "bytes": MIB, "edge_s": s, "allreduce_s": allreduce_s + i * 1e-4}
        for i, s in enumerate(edge_seconds)
    }


WORKERS5 = [f"w{i}" for i in range(5)]


def test_preflight_links_a_slow_worker_is_named_with_both_of_its_links():
    # w2's links both ways (w1 -> w2 is link 1, w2 -> w3 is link 2) take 0.4 s, the rest 1 ms
    verdict = checks.judge_links(rows([0.001, 0.4, 0.4, 0.001, 0.001]), WORKERS5, 0.5)
    assert [(f.worker, f.check) for f in verdict.findings] == [("w2", "link")]
    assert verdict.findings[0].message == (
        "ring links 0.00262 GB/s in, 0.00262 GB/s out, median 1.05 GB/s (over the 50% margin)"
    )
    assert verdict.medians["link_gbps"] == pytest.approx(1.049, rel=1e-3)
    assert verdict.medians["allreduce_s"] == pytest.approx(0.0024)  # the slowest rank's
    assert verdict.figures["w2"] == {"link_out_gbps": 0.003, "link_in_gbps": 0.003}
    assert verdict.figures["w0"]["link_out_gbps"] == pytest.approx(1.049, rel=1e-3)


def test_preflight_links_one_slow_worker_of_three_is_still_told_apart():
    # a plain median of three links would be a slow one; each neighbour keeps one fast link
    verdict = checks.judge_links(rows([0.001, 0.4, 0.4]), ["a", "b", "c"], 0.5)
    assert [f.worker for f in verdict.findings] == ["c"]


def test_preflight_links_a_slow_link_between_two_healthy_workers_names_both_ends():
    verdict = checks.judge_links(rows([0.001, 0.001, 0.3, 0.001, 0.001]), WORKERS5, 0.5)
    assert [(f.worker, f.message.split(" 0.")[0]) for f in verdict.findings] == [
        ("w2", "ring link to worker w3"),
        ("w3", "ring link from worker w2"),
    ]


def test_preflight_links_scheduler_noise_under_the_floor_names_no_one():
    # 10x slower, but 9 ms in all: a loaded machine's moment, not a link (MIN_LINK_SLOWER_S)
    verdict = checks.judge_links(rows([0.001, 0.01, 0.001, 0.001, 0.001]), WORKERS5, 0.5)
    assert verdict.findings == []


def test_preflight_links_a_failed_test_names_every_worker_that_took_no_part():
    partial = {0: rows([0.001, 0.001])[0]}
    verdict = checks.judge_links(partial, ["a", "b"], 0.5, "mpirun exited with code 1: no route to host")
    assert [(f.worker, f.message) for f in verdict.findings] == [
        ("b", "took no part in the link test over all workers: mpirun exited with code 1: no route to host")
    ]


def test_preflight_links_the_probe_and_the_judge_agree_on_a_good_link():
    edges = [0.002, 0.5, 0.5, 0.002, 0.003, 0.002]
    assert checks.link_reference(edges) == link_probe.reference(edges) == 0.002


@pytest.mark.parametrize(
    "line",
    [
        "[1,3]<stdout>: mpilaunch-link: {}",  # Open MPI's --output tag
        "[3] mpilaunch-link: {}",  # MPICH's -prepend-rank
        "mpilaunch-link: {}",
    ],
)
def test_preflight_links_lines_are_read_through_any_rank_tag(line):
    said = {"rank": 3, "edge_s": 0.001}
    out = "\n".join(["noise", line.format(json.dumps(said)), "mpilaunch-link: not json", "x"])
    assert preflight_links.parse(out) == {3: said}
