"""Placement verification, the pure part: start lines against the plan, and the hints."""

import pytest

from mpilaunch.core import placement, rank_lines
from mpilaunch.core.placement import RankStart
from mpilaunch.core.spec import Plan, WorkerPlan

PLAN = Plan("j", (WorkerPlan("j-worker-0", 2, 0), WorkerPlan("j-worker-1", 2, 0)))


def good_starts():
    return [RankStart(r, r % 2, 4, f"j-worker-{r // 2}", "node") for r in range(4)]


def test_verify_start_line_round_trips_through_the_wrapper_format():
    env = {"PMI_RANK": "3", "MPI_LOCALRANKID": "1", "PMI_SIZE": "4", "MPILAUNCH_WORKER": "j-worker-1"}
    line = rank_lines.format_start(env)
    parsed = rank_lines.parse_start("[3] " + line + "\0")
    assert parsed[:4] == (3, 1, 4, "j-worker-1")
    ompi = rank_lines.format_start(
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    )
    assert rank_lines.parse_start(ompi)[:4] == (0, 0, 2, rank_lines.NO_WORKER)  # no agent: no worker


def test_verify_accepts_the_planned_placement():
    assert placement.check(PLAN, good_starts(), complete=True) is None
    assert placement.check(PLAN, good_starts()[:3], complete=False) is None  # more may come


def test_verify_names_ranks_started_on_the_launcher():
    starts = good_starts()
    starts[0] = RankStart(0, 0, 4, rank_lines.NO_WORKER, "node")
    starts[1] = RankStart(1, 1, 4, rank_lines.NO_WORKER, "node")
    m = placement.check(PLAN, starts[:2], complete=False)  # fails fast, before the rest report
    assert m.kind == placement.LAUNCHER
    assert "ranks 0-1 started on the launcher" in m.message and "4 ranks on 2 workers" in m.message


@pytest.mark.parametrize(
    "starts,kind,text",
    [
        ([RankStart(0, 0, 2, "j-worker-0", "h")], placement.SIZE, "size 2"),
        (
            [
                RankStart(0, 0, 4, "j-worker-0", "h"),
                RankStart(1, 1, 4, "j-worker-0", "h"),
                RankStart(2, 2, 4, "j-worker-0", "h"),
            ],
            placement.OVERFULL,
            "worker j-worker-0 runs 3 ranks",
        ),
        ([RankStart(0, 0, 4, "other-worker-0", "h")], placement.FOREIGN, "other-worker-0"),
        ([RankStart(1, 0, 4, "j-worker-0", "h"), RankStart(1, 0, 4, "j-worker-1", "h")], placement.DUPLICATE, "rank 1"),
    ],
)
def test_verify_definite_mismatches_fail_before_the_job_ends(starts, kind, text):
    m = placement.check(PLAN, starts, complete=False)
    assert m.kind == kind and text in m.message


def test_verify_missing_ranks_count_only_once_mpirun_ended_well():
    starts = good_starts()[:3]
    assert placement.check(PLAN, starts, complete=False) is None
    m = placement.check(PLAN, starts, complete=True)
    assert m.kind == placement.MISSING and "only 3 of 4 ranks started (missing: 3)" in m.message
    # a lost start line is made up for by the rank's exit status line
    assert placement.check(PLAN, starts, complete=True, finished={3: "j-worker-1"}) is None


def test_verify_local_rank_beyond_slots_means_workers_merged():
    starts = [RankStart(r, r, 4, f"j-worker-{r // 2}", "h") for r in range(4)]
    m = placement.check(PLAN, starts, complete=False)
    assert m.kind == placement.LOCAL_RANK and "rank 2 on worker j-worker-1 has local rank 2" in m.message


@pytest.mark.parametrize(
    "flavour,major,needle",
    [
        ("openmpi", 5, "ignores OMPI_MCA_plm_rsh_agent"),
        ("openmpi", 4, "OMPI_MCA_plm_rsh_agent"),
        ("mpich", 4, "-launcher-exec"),
        ("intel", 2021, "I_MPI_HYDRA_BOOTSTRAP"),
    ],
)
def test_verify_hint_names_what_the_detected_mpi_reads(flavour, major, needle):
    m = placement.Mismatch(placement.LAUNCHER, "x")
    assert needle in placement.likely_cause(m, flavour=flavour, major=major)
    local = placement.likely_cause(m, flavour=flavour, major=major, local_hosts=("localhost",))
    assert "localhost resolves to this machine" in local


def test_verify_summary_for_the_report():
    starts = good_starts()
    starts[3] = RankStart(3, 1, 4, rank_lines.NO_WORKER, "h")
    m = placement.check(PLAN, starts, complete=True)
    s = placement.summary(PLAN, starts, m, True)
    assert s["verified"] is False and s["mismatch"]["kind"] == placement.LAUNCHER
    assert s["workers"]["j-worker-1"] == {"planned_slots": 2, "ranks": [2]}
    assert s["workers"][placement.LAUNCHER_KEY]["ranks"] == [3]
    assert placement.summary(PLAN, good_starts(), None, False)["verified"] is None


def test_verify_ranges_keep_rank_lists_short():
    assert placement.ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"


def test_verify_fail_fast_collects_the_other_ranks_start_lines_first():
    from types import SimpleNamespace

    from mpilaunch.workloads.verification import placement_watch

    output = SimpleNamespace(starts=[(0, 0, 4, rank_lines.NO_WORKER, "h")], environments={})
    watch = placement_watch(PLAN, output, grace=30)
    assert watch() is None  # rank 1 is likely on its way: wait for it (up to the grace)
    output.starts += [(1, 1, 4, rank_lines.NO_WORKER, "h"), (2, 0, 4, "j-worker-1", "h"), (3, 1, 4, "j-worker-1", "h")]
    assert "ranks 0-1 started on the launcher" in watch().message  # all started: report now
    impatient = placement_watch(
        PLAN, SimpleNamespace(starts=[(0, 0, 4, rank_lines.NO_WORKER, "h")], environments={}), grace=0
    )
    assert "rank 0 started on the launcher" in impatient().message
    assert placement_watch(PLAN, SimpleNamespace(starts=[], environments={}), grace=0)() is None
