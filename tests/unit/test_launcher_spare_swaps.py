"""A launcher in the cluster that swaps spares in itself (k8s: the launcher pod, --retries with
--spares): the signed line that tells the submitting side (core/launcher_lines.py), the ended
attempt's rank lines handed back by the output (runtime/output.py), and the record the
submitting side keeps of it (job/spares.py, runtime/record.py). The swap itself runs on real
pods in tests/e2e/k8s/test_spares_pods.py."""

from __future__ import annotations

from mpilaunch.core import launcher_lines
from mpilaunch.core.rank_lines import format_start, format_status
from mpilaunch.job import spares
from mpilaunch.runtime.output import RankOutput


def test_spare_swap_line_round_trips_when_signed_with_the_jobs_token():
    line = launcher_lines.swap_line({"j-worker-1": "j-spare-0"}, "lost", "worker j-worker-1 was lost", 5, "tok1")
    assert line.startswith(launcher_lines.SWAP_PREFIX) and "\n" not in line
    assert launcher_lines.parse_swap(line, "tok1") == {
        "swaps": [{"worker": "j-worker-1", "spare": "j-spare-0", "why": "lost"}],
        "failure": "worker j-worker-1 was lost",
        "exit_code": 5,
    }


def test_spare_swap_line_forged_unsigned_or_garbled_moves_nothing():
    forged = launcher_lines.swap_line({"j-worker-0": "j-worker-1"}, "lost", None, 5, "someone-elses")
    assert launcher_lines.parse_swap(forged, "tok1") is None  # a program printing one has no token
    # never taken on trust: the submitting side deletes pods on its word
    assert launcher_lines.parse_swap(launcher_lines.swap_line({"a": "b"}, "lost", None, 5, None), None) is None
    assert launcher_lines.parse_swap(launcher_lines.swap_line({"a": "b"}, "lost", None, 5, "t"), None) is None
    assert launcher_lines.parse_swap(launcher_lines.SWAP_PREFIX + "token=tok1 {not json", "tok1") is None
    assert (
        launcher_lines.parse_swap(launcher_lines.SWAP_PREFIX + 'token=tok1 {"swaps": [{"worker": 1}]}', "tok1") is None
    )
    assert (
        launcher_lines.parse_swap("mpilaunch: spare j-spare-0 takes the place of worker j-worker-1 (lost)", "t") is None
    )


def test_spare_the_launchers_own_relaunch_lines_are_notes_not_mpiruns_output():
    for line in (
        "mpilaunch: spare j-spare-0 takes the place of worker j-worker-1 (lost)",
        "mpilaunch: attempt 2 of 2: relaunching replacing j-worker-1 (attempt 1: worker lost)",
    ):
        assert line.startswith(launcher_lines.NOTES)
    assert not launcher_lines.SWAP_PREFIX.startswith(launcher_lines.NOTES)  # bookkeeping, never shown


def test_spare_output_hands_back_the_ended_attempts_rank_lines_and_counts_the_next_alone():
    output = RankOutput(None, None)
    output.token = "tok"
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MPILAUNCH_WORKER": "j-worker-1"}
    output.feed("stdout", format_start(env, token="tok") + "\n")
    output.feed("stdout", format_status("1", "j-worker-1", 137, token="tok") + "\n")
    ended = output.next_attempt()
    assert [s[0] for s in ended["statuses"]] == [1] and set(ended["rank_times"]) == {1}
    assert output.statuses == [] and output.rank_times == {} and output.starts == []
    output.feed("stdout", format_status("1", "j-worker-1", 0, token="tok") + "\n")
    assert [(s[0], s[2]) for s in output.statuses] == [(1, 0)]  # the relaunch's outcome alone


def test_spare_record_keeps_the_launchers_ended_attempt_and_its_swap_in_order():
    attempts, swaps, worker_times = [], [], {"j-worker-1": {"created": 1.0, "ready": 2.0}}
    relaunched = [
        {"at": 10.0, "ended": False, "swaps": [{"worker": "j-worker-0", "spare": "j-spare-0", "why": "preflight"}]},
        {
            "at": 14.0,
            "ended": True,
            "exit_code": 5,
            "failure": "worker j-worker-1 was lost",
            "swaps": [{"worker": "j-worker-1", "spare": "j-spare-1", "why": "lost"}],
            "ranks": {"rank_times": {0: [11.0, 13.5], 1: [11.1, None]}, "statuses": [(0, "j-worker-0", 1)]},
        },
    ]
    started = spares.record_relaunches(relaunched, attempts, swaps, worker_times, 9.0, 11.0, 1)
    assert started == 14.0  # the attempt still going began there
    assert [(s["worker"], s["spare"], s["why"], s["at_s"]) for s in swaps] == [
        ("j-worker-0", "j-spare-0", "preflight", 1.0),
        ("j-worker-1", "j-spare-1", "lost", 5.0),
    ]
    assert attempts == [
        {
            "attempt": 1,
            "started_s": 2.0,
            "ended_s": 5.0,
            "exit_code": 5,
            "failure": "worker j-worker-1 was lost",
            "lost_workers": ["j-worker-1"],
            "ranks": [[0, 2.0, 4.5, 1], [1, 2.1, None, None]],
        }
    ]
    assert worker_times == {"j-worker-1": {"created#1": 1.0, "ready#1": 2.0}}  # the lost pod's, kept apart


def test_spare_record_of_a_relaunched_launcher_counts_on_from_its_attempt():
    attempts: list = []
    ended = {"at": 3.0, "ended": True, "exit_code": 5, "failure": None, "ranks": None}
    ended["swaps"] = [{"worker": "w", "spare": "s", "why": "lost"}]
    spares.record_relaunches([ended], attempts, [], {}, 0.0, 1.0, first=3)
    assert attempts[0]["attempt"] == 3 and attempts[0]["ranks"] == []


def test_spare_yarn_launcher_reads_the_spares_registrations_oldest_first_and_skips_serving_ones():
    from mpilaunch.backends.yarn.in_cluster import spare_swaps

    reg = {
        "mpilaunch/worker/j-worker-0": b'{"address": "10.0.0.1:7000"}',  # a worker: no spare
        "mpilaunch/worker/j-spare-10": b'{"address": "10.0.0.9:7000"}',
        "mpilaunch/worker/j-spare-2": b'{"address": "10.0.0.3:7000"}',
        "mpilaunch/worker/j-spare-1": b'{"address": "10.0.0.2:7000"}',  # serving already
        "mpilaunch/worker/j-spare-3": b"{half written",
        "mpilaunch/worker/jx-spare-0": b'{"address": "10.0.0.5:7000"}',  # another job's name
    }
    found = spare_swaps.registered_spares(reg, "mpilaunch/", "j", {"j-spare-1"})
    assert found == [("j-spare-2", "10.0.0.3:7000"), ("j-spare-10", "10.0.0.9:7000")]
    assert spare_swaps.spare_index("j", "j-spare-7") == 7 and spare_swaps.spare_index("j", "j-spare-x") is None
