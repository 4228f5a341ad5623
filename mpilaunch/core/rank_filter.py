"""``--output-ranks LIST``: which ranks' lines this terminal shows (pure).

A list is numbers and ranges joined by commas (``0``, ``0,3``, ``0-3,8``).
Only the terminal is filtered: every rank's lines still reach its log
(``--output-dir``) and the failure report, and mpilaunch's own lines always
show.
"""

from __future__ import annotations

from .errors import UsageError
from .limits import MAX_RANKS

_EXAMPLE = "e.g. --output-ranks 0 or --output-ranks 0-3,8"


def parse_rank_list(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)``: sorted, each rank once; bad syntax is a UsageError."""
    ranks: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        first, dash, last = item.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise UsageError(
                f"--output-ranks {text!r}: {item!r} is not a rank or a range of ranks",
                f"give rank numbers and ranges separated by commas, {_EXAMPLE}",
            )
        low, high = int(first), int(last) if dash else int(first)
        if high >= MAX_RANKS:  # before the range is built: --output-ranks 0-99999999 must not fill memory
            raise UsageError(
                f"--output-ranks {text!r}: rank {high} is beyond any job (at most {MAX_RANKS} ranks)",
                f"choose ranks the job has, {_EXAMPLE}",
            )
        if high < low:
            raise UsageError(
                f"--output-ranks {text!r}: the range {item!r} runs backwards",
                f"write the lower rank first, {_EXAMPLE}",
            )
        ranks.update(range(low, high + 1))
    return tuple(sorted(ranks))


def check_against_plan(ranks: tuple[int, ...], total: int) -> None:
    """Every rank asked for exists in a job of ``total`` ranks (0 .. total-1)."""
    beyond = [r for r in ranks if r >= total]
    if beyond:
        which = "rank 0" if total == 1 else f"ranks 0-{total - 1}"
        raise UsageError(
            f"--output-ranks names rank {beyond[0]}, but the job has {which}",
            f"choose ranks the job has, {_EXAMPLE}",
        )
