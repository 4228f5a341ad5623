"""--straggler-report's tally (mpilaunch/hang/stragglers.py) over samples of every rank's stacks, as
the hang probe reports them; the probe and the sampling run for real in
tests/e2e/local/test_stragglers.py."""

from __future__ import annotations

import random

from mpilaunch.hang import stragglers
from mpilaunch.hang.verdict import NATIVE, PYTHON, RUNNING, Frame, RankStack

IN_ALLREDUCE = (Frame("PMPI_Allreduce", kind=NATIVE), Frame("main", "/job/train.py", 35, PYTHON))
LOADING = (Frame("time.sleep", kind=NATIVE), Frame("load_batch", "/job/train.py", 18, PYTHON))
COMPUTING = (Frame("compute", "/job/train.py", 23, PYTHON),)


def sample(places: dict[int, tuple]) -> list[RankStack]:
    return [RankStack(rank, f"w-{rank // 2}", RUNNING, frames) for rank, frames in places.items()]


def test_straggler_the_rank_the_others_wait_for_is_named_with_its_place_and_the_call():
    tally = stragglers.Tally()
    for i in range(10):
        places = dict.fromkeys(range(8), IN_ALLREDUCE)
        if i % 5:  # 8 samples of 10: rank 5 loading while the others wait
            places[5] = LOADING
        stragglers.add_sample(tally, sample(places))
    assert stragglers.straggler(tally) == 5
    assert stragglers.line(tally, 5) == (
        "mpilaunch: straggler: rank 5 (w-2) spent 80% of samples in load_batch at train.py:18 while 7 others "
        "waited in MPI_Allreduce"
    )
    found = stragglers.report(tally, 2.0)
    assert (found["samples"], found["samples_with_waiting"], found["straggler"]) == (10, 8, 5)
    assert found["shares"]["5"] == 0.8 and found["shares"]["0"] == 0.0


def test_straggler_no_false_report_on_a_healthy_job():
    """Every rank computes and waits in turn: each is seen outside now and then, none stands out."""
    rng = random.Random(7)
    tally = stragglers.Tally()
    for _ in range(40):
        outside = rng.sample(range(8), rng.randint(0, 3))
        stragglers.add_sample(tally, sample({r: COMPUTING if r in outside else IN_ALLREDUCE for r in range(8)}))
    assert stragglers.straggler(tally) is None
    assert stragglers.report(tally, 2.0)["line"] is None


def test_straggler_no_verdict_from_too_few_samples_or_when_most_ranks_are_outside():
    tally = stragglers.Tally()
    for _ in range(stragglers.MIN_SAMPLES - 1):
        stragglers.add_sample(tally, sample({0: LOADING, 1: IN_ALLREDUCE, 2: IN_ALLREDUCE}))
    assert stragglers.straggler(tally) is None
    busy = stragglers.Tally()  # 5 of 8 computing: nobody is waited for by a majority
    for _ in range(10):
        stragglers.add_sample(busy, sample({r: COMPUTING if r < 5 else IN_ALLREDUCE for r in range(8)}))
    assert busy.waited == 0 and stragglers.straggler(busy) is None


def test_straggler_sampling_gaps_vary_so_a_periodic_step_is_not_seen_at_the_same_moments():
    from mpilaunch.workloads.straggler_watch import sampling_gap

    gaps = [sampling_gap(0.5, random.random()) for _ in range(2000)]
    assert 0.25 <= min(gaps) < 0.3 and 0.7 < max(gaps) < 0.75
    assert abs(sum(gaps) / len(gaps) - 0.5) < 0.02  # the rate asked for, on average
    # a 1.0 s step sampled from t=0: the moments within the step spread over it, not two points
    moments, t = set(), 0.0
    for gap in gaps[:200]:
        t += gap
        moments.add(int((t % 1.0) * 10))
    assert len(moments) == 10, moments
