"""The outcome of an mpirun job: per-rank exit codes, the first failure, and the summary line.

Pure functions of the plan and the collected output (``output.RankOutput``),
used by the mpirun workload (``mpirun.py``) after mpirun ended or was stopped.
"""

from __future__ import annotations

from ..core import mpi
from ..core.result import RankStatus
from ..core.spec import Plan
from ..runtime.output import RankOutput

# After a daemon failed, mpirun gets this long to end the job itself (mpirun._wait).
FAIL_FAST_GRACE_S = 5.0


NEVER_STARTED = "mpirun never started"


def unobserved_reason(mpirun_code: int | None, stopped: str | None) -> str | None:
    """Why a rank whose status line never arrived has no exit code; None: it exited 0.

    Only an mpirun that ended by itself with 0 vouches for the ranks (every MPI
    flavour's mpirun fails when any rank does). One that mpilaunch stopped
    (``stopped``: why) vouches for nothing, whatever code its teardown left.
    """
    if stopped:
        return stopped
    if mpirun_code == 0:
        return None
    if mpirun_code is None:
        return NEVER_STARTED
    return f"mpirun exited with code {mpirun_code} before this rank's exit status came"


def rank_statuses(
    plan: Plan, output: RankOutput, mpirun_code: int | None, stopped: str | None = None
) -> list[RankStatus]:
    """Per-rank exit codes from the wrappers' status lines.

    A rank whose line never arrived gets None and the reason (``unobserved``),
    except after mpirun ended by itself with 0 (``unobserved_reason``).
    """
    reported = {rank: (worker, code) for rank, worker, code in output.statuses}
    assigned = plan.rank_to_worker()
    why = unobserved_reason(mpirun_code, stopped)
    missing = None if why else 0
    out = []
    for r in range(plan.ranks):
        worker, code = reported.get(r, (assigned[r], missing))
        out.append(
            RankStatus(
                rank=r,
                worker=worker,
                exit_code=code,
                oom_killed=r in output.oom_killed,
                unobserved=why if r not in reported and why else None,
            )
        )
    return out


def mpirun_named_first(statuses, named: tuple[int, int] | None, assigned: list[str]) -> list[tuple[int, str, int]]:
    """The status lines with the rank mpirun names as the first to fail
    (mpi.first_failed_rank) put first, and added from mpirun's words when its
    own line never arrived. Otherwise the summary could name a rank mpirun
    ended in the teardown (exit 143) while mpirun, just above it, names the
    one that failed."""
    if named is None:
        return list(statuses)
    rank, code = named
    own = next((s for s in statuses if s[0] == rank), None)
    if own is None:
        own = (rank, assigned[rank] if 0 <= rank < len(assigned) else "?", code)
    return [own] + [s for s in statuses if s[0] != rank]


def decide_outcome(mpirun_code: int, output: RankOutput) -> tuple[int, tuple[int, str, int] | None]:
    """Exit code of the job: the first failing rank's code, else mpirun's."""
    first_failure = next((s for s in output.statuses if s[2] != 0), None)
    if first_failure is not None:
        return first_failure[2], first_failure
    return mpirun_code, None


def daemon_failure_message(worker: str, code: int, output: RankOutput) -> str:
    """mpilaunch ended an mpirun that kept waiting for a failed daemon (see _wait)."""
    head = (
        f"the MPI daemon on worker {worker} ended with code {code} before any rank failed, "
        f"and mpirun kept waiting for it (stopped after {FAIL_FAST_GRACE_S:g} s)"
    )
    cause = mpi.daemon_error(output.launcher_head)
    if cause:
        head += f"; MPI daemon {cause}"
    tail = list(output.launcher_tail)
    return "\n".join([head] + ([f"last {len(tail)} lines of mpirun:"] + ["  | " + t for t in tail] if tail else []))


# What a rank that mpirun ended after the first failure reports: SIGTERM
# forwarded by its wrapper (128 + 15), or SIGKILL (128 + 9).
ENDED_BY_TEARDOWN = (143, 137)


def other_failures(statuses, first_rank: int, oom_killed=(), listed: int = 8) -> str:
    """The ranks besides the first that failed by themselves, in the order their status lines came.

    Ranks that mpirun ended because the first one failed (ENDED_BY_TEARDOWN,
    unless the OOM killer did it) are not failures of their own and are left
    out: "also failed" names ranks a user has to look at too.
    """
    others = [
        f"{rank} on {worker} (exit {code})"
        for rank, worker, code in statuses
        if code != 0 and rank != first_rank and (code not in ENDED_BY_TEARDOWN or rank in oom_killed)
    ]
    if not others:
        return ""
    more = f" and {len(others) - listed} more" if len(others) > listed else ""
    return f"also failed: rank{'s' if len(others) > 1 else ''} {', '.join(others[:listed])}{more}"


def failure_message(failure, output: RankOutput, mpirun_code: int, stopped: str | None = None) -> str:
    if failure is not None:
        rank, worker, code = failure
        head = f"rank {rank} on worker {worker} exited with code {code}"
        if rank in output.oom_killed:
            head += (
                ": killed by the kernel's out-of-memory killer (its worker's memory limit was reached; "
                "give the workers more memory or the ranks less work)"
            )
        tail = list(output.tails.get(rank, []))
        others = other_failures(output.statuses, rank, output.oom_killed)
        if others:
            head += f"\n{others}"
    else:
        # stopped: its code is the teardown's, not news (a lost worker's line comes first, lifecycle.py)
        head = stopped or f"mpirun exited with code {mpirun_code} before any rank failed"
        cause = mpi.daemon_error(output.launcher_head)
        if cause:
            head += f"; MPI daemon {cause}"
        tail = list(output.launcher_tail)
    lines = [head]
    if tail:
        lines.append(f"last {len(tail)} lines of {'rank ' + str(failure[0]) if failure else 'mpirun'}:")
        lines += ["  | " + t for t in tail]
    hint = None if failure is not None or stopped else mpi.launch_hint(output.launcher_head + tail)
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)
