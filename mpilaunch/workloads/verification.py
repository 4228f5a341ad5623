"""Placement verification around a launch: the fail-fast watch and the check after mpirun.

The comparison itself is pure (:mod:`mpilaunch.core.placement`); this module adds
the clock (how long to wait for the other ranks' start lines) and the host
name lookups behind the hints.
"""

from __future__ import annotations

import socket
import time

from ..core import envcheck, placement
from ..core.spec import JobSpec, Plan
from ..runtime.output import RankOutput

MISPLACED_GRACE_S = 1.0  # after a misplaced rank, how long to collect the other ranks' start lines


def resolves_here(name: str) -> bool:
    """Whether mpirun would fork a rank for host ``name`` itself instead of calling the agent."""
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return False
    if address.startswith("127.") or address == "0.0.0.0":
        return True
    try:
        return address in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def rank_workers(output: RankOutput) -> dict[int, str]:
    return {t[0]: t[3] for t in list(output.starts)}


def environment_mismatch(expected: envcheck.Expected | None, output: RankOutput) -> placement.Mismatch | None:
    if expected is None:
        return None
    return envcheck.check(expected, {r: dict(e) for r, e in list(output.environments.items())}, rank_workers(output))


def placement_watch(
    plan: Plan, output: RankOutput, expected: envcheck.Expected | None = None, grace: float = MISPLACED_GRACE_S
):
    """The fail-fast check the launch loops call: definite mismatches only, cached per start count.
    The environment check (``expected``) counts as one: a rank's program or MPI library.

    A mismatch is reported once every rank has started or ``grace`` seconds
    after it was first seen, so the message names all the misplaced ranks
    (ranks started together report a few ms apart), not the first one alone.
    """
    seen = {"n": -1, "mismatch": None, "since": None}

    def current():
        n = len(output.starts) + sum(1 for e in list(output.environments.values()) if "mpi_library" in e)
        if n != seen["n"]:
            seen["n"] = n
            starts = [placement.RankStart.from_tuple(t) for t in list(output.starts)]
            seen["mismatch"] = placement.check(plan, starts, complete=False) or environment_mismatch(expected, output)
        if seen["mismatch"] is None:
            return None
        if seen["since"] is None:
            seen["since"] = time.monotonic()
        if len(output.starts) >= plan.ranks or time.monotonic() - seen["since"] >= grace:
            return seen["mismatch"]
        return None

    return current


def verify_placement(
    spec: JobSpec,
    plan: Plan,
    info,
    output: RankOutput,
    mpirun_code: int | None,
    hosts: dict[str, str],
    expected: envcheck.Expected | None = None,
) -> tuple[placement.Mismatch | None, str | None]:
    """(mismatch, hint) after mpirun ended; missing ranks count only when it ended well.
    Placement first, then the environment check (``expected``)."""
    starts = [placement.RankStart.from_tuple(t) for t in output.starts]
    ended_well = mpirun_code == 0 and not any(code != 0 for _, _, code in output.statuses)
    finished = {rank: worker for rank, worker, _ in output.statuses}
    mismatch = placement.check(plan, starts, complete=ended_well, finished=finished)
    if mismatch is None:
        mismatch = environment_mismatch(expected, output)
        return mismatch, (None if mismatch is None else envcheck.hint(mismatch, expected))
    local = tuple(h for h in hosts.values() if resolves_here(h)) if mismatch.kind == placement.LAUNCHER else ()
    hint = placement.likely_cause(
        mismatch, flavour=info.flavour, major=info.major, local_hosts=local, mpi_args=spec.mpi_args
    )
    return mismatch, hint
