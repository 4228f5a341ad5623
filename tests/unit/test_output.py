"""Splitting mpirun's tagged output per rank and catching rank status lines."""

import io

import pytest

from mpilaunch.core.rank_lines import format_status, parse_status
from mpilaunch.runtime.output import RankOutput
from support.mpi_outputs import OPENMPI4_ABORT, OPENMPI5_ABORT


def test_status_lines_are_consumed_not_echoed(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err, tmp_path)
    sink.feed("stdout", "[1,0]<stdout>: hello\n")
    sink.feed("stderr", "[1,1]<stderr>: " + format_status("1", "w-1", 7) + "\n")
    sink.feed("stderr", "[1,0]<stderr>: \0 " + format_status("0", "w-0", 0) + "\n")
    sink.feed("stderr", "[2] " + format_status("2", "w-1", 0) + "[2] \n")
    sink.feed("stderr", "untagged launcher message\n")
    sink.close()
    assert sink.statuses == [(1, "w-1", 7), (0, "w-0", 0), (2, "w-1", 0)]
    assert "mpilaunch-rank-status" not in out.getvalue() + err.getvalue()
    assert (tmp_path / "rank-0.log").read_text() == "hello\n"
    assert "[0] hello" in out.getvalue()
    assert list(sink.launcher_tail) == ["untagged launcher message"]


def test_text_glued_before_a_status_line_is_kept():
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err)
    sink.feed("stderr", "[1,3]<stderr>: partial" + format_status("3", "w", 1) + "\n")
    assert sink.statuses == [(3, "w", 1)]
    assert list(sink.tails[3]) == ["partial"]


def test_prrte_benign_setpgid_race_warning_is_dropped():
    # The exact line Open MPI 5's prterun printed here in about one launch in
    # eight (its parent-side setpgid lost the race with the child's exec).
    benign = "[vm:28550] plm:ssh: Warning: setpgid(28557,28557) failed in parent with errno=Permission denied(13)"
    other_errno = "[vm:28550] plm:ssh: Warning: setpgid(28557,28557) failed in parent with errno=No such process(3)"
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err)
    sink.feed("stderr", benign + "\n")
    sink.feed("stderr", other_errno + "\n")
    sink.feed("stderr", "[1,0]<stderr>: " + benign + "\n")  # a rank's own output is never filtered
    sink.close()
    assert err.getvalue() == other_errno + "\n" + "[0] " + benign + "\n"
    assert list(sink.launcher_tail) == [other_errno]


def test_parse_status_rejects_garbage():
    assert parse_status("mpilaunch-rank-status: rank=x exit=1") is None
    assert parse_status("nothing here") is None


def test_lines_split_across_chunks_are_reassembled_per_rank():
    # Hydra tags chunks, not lines: rank 2's line ends two output lines later.
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err)
    sink.feed("stdout", '[2] {"rank": 2}[0] {"rank": 0}\n')
    sink.feed("stdout", "[1] one\n")
    sink.feed("stdout", "[2] \n")
    # Open MPI 4 closes a rank's last line with an empty tag.
    sink.feed("stdout", "[1,3]<stdout>:three[1,3]<stdout>:\n")
    sink.feed("stdout", "[1,4]<stdout>:unterminated")
    sink.close()
    assert out.getvalue().splitlines() == [
        '[0] {"rank": 0}',
        "[1] one",
        '[2] {"rank": 2}',
        "[3] three",
        "[4] unterminated",
    ]


def test_rank_wrapper_lingers_only_until_the_daemon_has_read_its_status_line():
    """Open MPI linger: gone as soon as the pipe is drained, the full limit while nobody reads."""
    import os
    import time

    from mpilaunch.rank import wait_until_read

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"mpilaunch-rank-status: rank=0 worker=w exit=0\n")
        t0 = time.monotonic()
        wait_until_read(write_end, 0.3)
        assert time.monotonic() - t0 >= 0.29  # nobody read: the whole limit
        os.read(read_end, 4096)
        t0 = time.monotonic()
        wait_until_read(write_end, 5.0)
        assert time.monotonic() - t0 < 1.0  # drained: returns at once, not after 5 s
    finally:
        os.close(read_end)
        os.close(write_end)


# What mpirun printed for tests/programs/fail_rank.py with FAIL_RANK=3 FAIL_CODE=7
# (Debian's Open MPI 4.1.4, and PyPI's Open MPI 5.0.11 through prterun).


@pytest.mark.parametrize("lines", [OPENMPI4_ABORT, OPENMPI5_ABORT], ids=["openmpi4", "openmpi5"])
def test_first_failed_rank_is_read_from_mpiruns_abort_message(lines):
    from mpilaunch.core.mpi import first_failed_rank

    assert first_failed_rank(lines) == (3, 7)
    assert first_failed_rank(["[0] Process name: [[1,1],0]", "Exit code: 1"]) is None  # a rank's own text
    assert first_failed_rank(lines[:-2]) is None  # cut before the exit code: nothing half-read


def test_the_rank_mpirun_names_first_is_the_failure_reported():
    from mpilaunch.workloads.mpirun import decide_outcome, mpirun_named_first

    assigned = ["w0", "w0", "w1", "w1"]
    teardown_first = [(0, "w0", 143), (3, "w1", 7), (1, "w0", 143)]
    statuses = mpirun_named_first(teardown_first, (3, 7), assigned)
    assert statuses == [(3, "w1", 7), (0, "w0", 143), (1, "w0", 143)]
    output = RankOutput(None, None)
    output.statuses = statuses
    assert decide_outcome(143, output) == (7, (3, "w1", 7))
    # rank 3's own line never came: mpirun's word for it, on the worker the plan gave it
    assert mpirun_named_first([(0, "w0", 143)], (3, 7), assigned) == [(3, "w1", 7), (0, "w0", 143)]
    # mpirun named nobody (MPICH, or no abort message): the lines as they came
    assert mpirun_named_first(teardown_first, None, assigned) == teardown_first


def test_other_failures_names_ranks_that_failed_by_themselves_only():
    from mpilaunch.workloads.mpirun import other_failures

    statuses = [(2, "w1", 7), (0, "w0", 143), (3, "w1", 7), (1, "w0", 137), (4, "w2", 0)]
    # 143/137 are mpirun's teardown after rank 2 failed, not failures of their own
    assert other_failures(statuses, 2) == "also failed: rank 3 on w1 (exit 7)"
    # ...unless the kernel's OOM killer sent that SIGKILL
    assert other_failures(statuses, 2, oom_killed={1}) == "also failed: ranks 3 on w1 (exit 7), 1 on w0 (exit 137)"
    assert other_failures([(2, "w1", 7)], 2) == ""
    many = [(r, "w", 1) for r in range(12)]
    assert (
        other_failures(many, 0, listed=3)
        == "also failed: ranks 1 on w (exit 1), 2 on w (exit 1), 3 on w (exit 1) and 8 more"
    )
