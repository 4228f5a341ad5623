"""mpirun's output tags: which rank wrote each piece of a line.

mpirun tags each *chunk* it forwards, not each line: a rank's line can
arrive as "[2] {text" ... "[2] \n" with other ranks' chunks in between on
the same output line (hydra), and Open MPI 4 ends a rank's last line with
an empty tag ("text[1,3]<stdout>:"). So a line of mpirun output is split
into (rank, fragment) segments and RankOutput reassembles lines per rank.
Runs on every line of output: the patterns are fixed here, not asked of
each flavour (Open MPI's tag and hydra's -prepend-rank are the two there are).
"""

from __future__ import annotations

import re

from .base import MpiInfo
from .registry import FLAVOURS

# Open MPI 5 puts one space after its tag, Open MPI 4 none: eating an optional
# space under 4 took a real one from the rank's text (seen: with
# PYTHONUNBUFFERED=1, print("rank", 0) arrives as chunks "rank", " ", "0",
# and came out as "rank0").
_OMPI_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>: ?")
_OMPI4_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>:")
# Hydra's "[N] " is only taken as a tag when the line starts with one, so a
# rank printing "[3] " in Open MPI output is left alone.
_HYDRA_TAG = re.compile(r"\[(\d+)\] ?")


def split_tagged(line: str, ompi_tag_space: bool = True) -> list[tuple[int | None, str]]:
    """One line of mpirun output (no newline) -> [(rank or None, fragment), ...].

    ``ompi_tag_space``: Open MPI 5's tag ends with a space of its own (4's does not)."""
    for tag in (_OMPI_TAG if ompi_tag_space else _OMPI4_TAG, _HYDRA_TAG):
        if tag.match(line):
            marks = list(tag.finditer(line))
            return [
                (int(m[1]), line[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(line)])
                for i, m in enumerate(marks)
            ]
    return [(None, line)]


def tag_has_space(info: MpiInfo) -> bool:
    """Whether this mpirun's output tag carries a space of its own (split_tagged). A flavour
    not known here (a launcher's report of one) is read like Open MPI 5 and hydra."""
    flavour = FLAVOURS.get(info.flavour)
    return True if flavour is None else flavour.tag_has_space(info.major)
