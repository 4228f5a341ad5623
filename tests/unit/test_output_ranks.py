"""--output-ranks LIST (issue 51, item 6): only those ranks' lines on the terminal, every rank in its log."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from mpilaunch.core.errors import UsageError
from mpilaunch.core.rank_filter import check_against_plan, parse_rank_list
from mpilaunch.core.rank_lines import format_status
from mpilaunch.runtime.output import RankOutput
from support.helpers import REPO


def run_cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "MPILAUNCH_BACKEND"}
    return subprocess.run(
        [sys.executable, "-m", "mpilaunch", *args], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )


def test_output_ranks_lists_and_ranges_parse():
    assert parse_rank_list("0") == (0,)
    assert parse_rank_list("0,3") == (0, 3)
    assert parse_rank_list("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_rank_list(" 8, 2-3 ,2") == (2, 3, 8)
    for bad, said in (
        ("", "'' is not a rank"),
        ("a", "'a' is not a rank"),
        ("-1", "'-1' is not a rank"),
        ("3-1", "the range '3-1' runs backwards"),
        ("0-", "'0-' is not a rank"),
        ("0-99999999", "rank 99999999 is beyond any job"),
    ):
        with pytest.raises(UsageError, match=said):
            parse_rank_list(bad)
    check_against_plan((0, 3), 4)
    with pytest.raises(UsageError, match=r"--output-ranks names rank 4, but the job has ranks 0-3"):
        check_against_plan((0, 4, 9), 4)
    with pytest.raises(UsageError, match=r"but the job has rank 0$"):
        check_against_plan((1,), 1)


def test_output_ranks_beyond_the_plan_is_refused_before_anything_runs():
    proc = run_cli("--np", "4", "--output-ranks", "0,9", "--dry-run", "--", "true")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "mpilaunch: error: --output-ranks names rank 9, but the job has ranks 0-3", proc.stderr
    assert lines[1].startswith("  hint: choose ranks the job has, e.g. --output-ranks 0") and len(lines) == 2
    bad = run_cli("--np", "4", "--output-ranks", "zero", "--dry-run", "--", "true")
    assert bad.returncode == 2 and "--output-ranks 'zero': 'zero' is not a rank" in bad.stderr, bad.stderr
    ps = run_cli("--workers", "2", "--output-ranks", "0", "--dry-run", "--", "true")
    assert ps.returncode == 2 and "PS tasks are not ranks" in ps.stderr, ps.stderr
    ok = run_cli("--np", "4", "--output-ranks", "1-3", "--dry-run", "--", "true")
    assert ok.returncode == 0, ok.stderr


def test_output_ranks_filters_the_terminal_not_the_logs(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    sink = RankOutput(out, err, tmp_path, shown_ranks=(0, 2))
    for rank in range(4):
        sink.feed("stdout", f"[1,{rank}]<stdout>: step 1 of rank {rank}\n")
        sink.feed("stderr", f"[1,{rank}]<stderr>: warn {rank}\n")
        sink.feed("stderr", f"[1,{rank}]<stderr>: " + format_status(str(rank), "w", 0) + "\n")
    sink.feed("stderr", "mpirun's own line\n")
    sink.close()
    assert out.getvalue().splitlines() == ["[0] step 1 of rank 0", "[2] step 1 of rank 2"]
    assert err.getvalue().splitlines() == ["[0] warn 0", "[2] warn 2", "mpirun's own line"]
    for rank in range(4):  # every rank still in its log, its tail (failure reports) and its status
        assert (tmp_path / f"rank-{rank}.log").read_text() == f"step 1 of rank {rank}\nwarn {rank}\n"
        assert list(sink.tails[rank]) == [f"step 1 of rank {rank}", f"warn {rank}"]
    assert sorted(r for r, _, _ in sink.statuses) == [0, 1, 2, 3]
