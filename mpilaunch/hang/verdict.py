"""Every rank's stacks in, groups of identical stacks and one ``mpilaunch: hang:`` line out.

Pure: no I/O. The collection (``collect``) builds the :class:`RankStack` list;
``diagnose`` groups it and names the odd rank(s) out. A hang of an allreduce
job looks like this: most ranks wait inside the same MPI call, from the same
line of the program, and one or a few are elsewhere (sleeping, computing,
stopped, gone). Those few are what the user needs named, with their worker,
the innermost line of *their* code (not site-packages, not the stdlib, not
mpilaunch) and the innermost function they are in.

Stacks are compared on what stays put while a rank waits: its Python frames
and the native frames from the MPI call outward. The native frames inside an
MPI call (the progress loop, poll, a spin) change from one sample to the next
and are left out of the comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.result import number_ranges

PREFIX = "mpilaunch: hang:"

# a rank's state, as the collection found its process
RUNNING = "running"  # alive and not stopped (R, S or D in /proc/PID/stat)
STOPPED = "stopped"  # T or t: SIGSTOP, SIGTSTP, a debugger
EXITED = "exited"  # the process ended (its code, where known)
UNREACHABLE = "unreachable"  # its worker did not answer in time
NOT_FOUND = "not found"  # the worker answered, and no process of that rank runs there
STATES = (RUNNING, STOPPED, EXITED, UNREACHABLE, NOT_FOUND)

PYTHON = "python"
NATIVE = "native"

# The MPI standard's API (and its profiling twins, PMPI_*): one capital, then lower case words
# (MPI_Allreduce, MPI_Comm_dup). MPICH's and Open MPI's internals are named otherwise (MPIR_, ompi_),
# and so are mpi4py's (MPI_PyMPI_Commctx_INTRA).
_MPI_API = re.compile(r"^P?(MPI_[A-Z][a-z0-9]*(?:_[a-z0-9]+)*)$")
# a native frame py-spy could not name: its address, which differs between processes (ASLR)
_UNNAMED = re.compile(r"^0x[0-9a-f]+$")
# the first call on a line of source: "x = comm.allreduce(y)" -> "comm.allreduce"
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*\(")
_NOT_CALLS = {
    "if",
    "elif",
    "while",
    "for",
    "return",
    "yield",
    "assert",
    "not",
    "and",
    "or",
    "in",
    "print",
    "with",
    "lambda",
    "await",
    "del",
    "except",
}
# paths that are not the user's code: installed packages, the standard library, mpilaunch itself
# (not the programs and examples its checkout and image hold: /opt/mpilaunch/tests/programs/)
_NOT_USER = re.compile(
    r"/(site|dist)-packages/|/lib/python\d[\d.]*/|/lib64/python\d|/mpilaunch/(?!tests/|examples/)"
    r"|^<|\.zip/"
)


@dataclass(frozen=True)
class Frame:
    function: str
    file: str = ""
    line: int = 0
    kind: str = PYTHON  # PYTHON or NATIVE
    code: str = ""  # the source line (Python frames, where the worker could read the file)

    def to_dict(self) -> dict:
        out = {"function": self.function, "file": self.file, "line": self.line, "kind": self.kind}
        if self.code:
            out["code"] = self.code
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Frame":
        return cls(
            str(d.get("function") or "?"),
            str(d.get("file") or ""),
            int(d.get("line") or 0),
            NATIVE if d.get("kind") == NATIVE else PYTHON,
            str(d.get("code") or ""),
        )


@dataclass(frozen=True)
class RankStack:
    """One rank as the collection found it: its main thread's frames, innermost first."""

    rank: int
    worker: str
    state: str
    frames: tuple[Frame, ...] = ()
    exit_code: int | None = None  # EXITED: the rank's own code, where known
    pid: int | None = None
    note: str = ""  # why frames are missing or partial (py-spy refused, no tool), or what the worker said
    tool: str = ""  # what took the frames: py-spy, py-spy --native, faulthandler

    def to_dict(self) -> dict:
        out = {
            "rank": self.rank,
            "worker": self.worker,
            "state": self.state,
            "frames": [f.to_dict() for f in self.frames],
        }
        for key in ("exit_code", "pid", "note", "tool"):
            value = getattr(self, key)
            if value not in (None, ""):
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RankStack":
        state = d.get("state") if d.get("state") in STATES else NOT_FOUND
        return cls(
            int(d["rank"]),
            str(d.get("worker") or "?"),
            state,
            tuple(Frame.from_dict(f) for f in d.get("frames") or ()),
            d.get("exit_code"),
            d.get("pid"),
            str(d.get("note") or ""),
            str(d.get("tool") or ""),
        )


def is_user_file(path: str) -> bool:
    """The user's own code: not an installed package, not the standard library, not mpilaunch."""
    return bool(path) and not _NOT_USER.search(path)


# mpi4py's communicator methods by the MPI operation they are (``comm.Barrier``, ``world.allreduce``)
_MPI4PY_CALL = re.compile(r"^[A-Za-z_]\w*\.([A-Za-z]+)$")
_MPI_OPERATIONS = frozenset(
    "barrier bcast reduce allreduce gather allgather scatter alltoall send recv sendrecv isend irecv "
    "wait waitall waitany probe iprobe scan exscan".split()
)


def user_frame(frames) -> Frame | None:
    """The innermost Python frame of the user's code (the innermost Python frame when none is)."""
    python = [f for f in frames if f.kind == PYTHON]
    return next((f for f in python if is_user_file(f.file)), python[0] if python else None)


def mpi_call(frames) -> tuple[int, str] | None:
    """(index, name) of the outermost MPI API call among the native frames (``PMPI_Recv`` -> ``MPI_Recv``)."""
    found = None
    for i, f in enumerate(frames):
        if f.kind == NATIVE:
            m = _MPI_API.match(f.function)
            if m:  # MPI 4's large-count twins (MPICH's mpi4py calls MPI_Recv_c) by the standard name
                found = (i, m[1][:-2] if m[1].endswith("_c") else m[1])
    return found


def called_on(code: str) -> str | None:
    """The first function a source line calls: ``time.sleep(5)`` -> ``time.sleep`` (a comment's words are no call)."""
    for m in _CALL.finditer(code.split("#", 1)[0]):
        if m[1] not in _NOT_CALLS:
            return m[1]
    return None


def innermost_function(frames) -> str:
    """What the rank is in, as a user would name it: the MPI call it waits in, else the call on the
    line of the innermost Python frame when that is the user's (``time.sleep``), else the innermost
    Python function, else the innermost native one."""
    mpi = mpi_call(frames)
    if mpi is not None:
        return mpi[1]
    python = [f for f in frames if f.kind == PYTHON]
    if python:
        inner = python[0]
        if is_user_file(inner.file):
            return called_on(inner.code) or inner.function
        return inner.function
    return frames[0].function if frames else "?"


def place_function(frames) -> str:
    """``innermost_function``, and the call on the user's innermost line where library code runs below
    it: ``synchronize via hvd.allreduce``. A framework's innermost Python function (Horovod's
    ``synchronize``, a trainer's ``_next_data``) is where the rank is; the user's call is what they
    wrote and what they will look for. An MPI call or the user's own innermost frame needs nothing more."""
    inner = innermost_function(frames)
    python = [f for f in frames if f.kind == PYTHON]
    if mpi_call(frames) is not None or not python or is_user_file(python[0].file):
        return inner
    user = next((f for f in python if is_user_file(f.file)), None)
    call = called_on(user.code) if user is not None else None
    if not call or call.rsplit(".", 1)[-1] == inner:  # dist.all_reduce -> all_reduce: nothing to add
        return inner
    return f"{inner} via {call}"


def short_file(path: str) -> str:
    return path.rsplit("/", 1)[-1] if path else "?"


def where(frames) -> str | None:
    """``train.py:41``: the innermost line of the user's code."""
    f = user_frame(frames)
    return f"{short_file(f.file)}:{f.line}" if f is not None else None


def signature(stack: RankStack) -> tuple:
    """What two ranks must share to be "in the same place": state, Python frames, and the native
    frames from the MPI call outward (those inside it change between two samples of a waiting rank)."""
    if stack.state in (EXITED, UNREACHABLE, NOT_FOUND):
        return (stack.state, stack.exit_code if stack.state == EXITED else None)
    frames = stack.frames
    mpi = mpi_call(frames)
    if mpi is not None:
        frames = frames[mpi[0] :]
    elif any(f.kind == PYTHON for f in frames):
        frames = tuple(f for f in frames if f.kind == PYTHON)
    return (
        stack.state,
        innermost_function(stack.frames),
        tuple((f.function, f.file, f.line) for f in frames if not _UNNAMED.match(f.function)),
    )


@dataclass
class Group:
    """Ranks whose stacks are the same (``signature``); ``stack`` is the lowest rank's."""

    ranks: list[int]
    workers: list[str]
    stack: RankStack

    @property
    def state(self) -> str:
        return self.stack.state

    @property
    def function(self) -> str:
        return innermost_function(self.stack.frames)

    @property
    def where(self) -> str | None:
        return where(self.stack.frames)

    def chain(self, limit: int = 6) -> str:
        """``MPI_Allreduce <- allreduce (train.py:41) <- main (train.py:60)``: the call and the Python
        frames around it, innermost first."""
        if self.state != RUNNING and self.state != STOPPED:
            return describe_state(self.stack)
        parts = [self.function]
        for f in [f for f in self.stack.frames if f.kind == PYTHON][:limit]:
            parts.append(f"{f.function} ({short_file(f.file)}:{f.line})")
        if len(parts) == 1 and self.stack.frames and self.stack.frames[0].function != self.function:
            parts.append(self.stack.frames[0].function)
        text = " <- ".join(parts)
        return f"stopped: {text}" if self.state == STOPPED else text

    def line(self) -> str:
        return f"{rank_word(self.ranks)} {rank_list(self.ranks)}: {self.chain()}"

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "workers": self.workers,
            "state": self.state,
            "function": self.function,
            "where": self.where,
            "summary": self.chain(),
            "frames": [f.to_dict() for f in self.stack.frames],
        }


@dataclass
class Diagnosis:
    groups: list[Group]
    odd: list[Group]  # the groups that stand out (none: every rank is in the same place, or no majority)
    verdict: str  # the one line, starting with PREFIX
    ranks: list[RankStack] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What ``mpilaunch stacks`` prints: one line per group, then the verdict."""
        return [g.line() for g in self.groups] + [self.verdict]

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "odd_ranks": sorted(r for g in self.odd for r in g.ranks),
            "groups": [g.to_dict() for g in self.groups],
        }


def rank_list(ranks) -> str:
    return number_ranges(ranks).replace(", ", ",")


def rank_word(ranks) -> str:
    return "rank" if len(ranks) == 1 else "ranks"


def mpi_name(function: str) -> str:
    """mpi4py's ``comm.Barrier`` as the C call it makes, ``MPI_Barrier``: how a rank whose native
    frames could not be read (py-spy's --native failed for it) names the call the others show."""
    m = _MPI4PY_CALL.match(function)
    if m is None or m[1].lower() not in _MPI_OPERATIONS:
        return function
    return f"MPI_{m[1][:1].upper()}{m[1][1:].lower()}"


def python_signature(stack: RankStack) -> tuple:
    """``signature`` from the Python frames alone, the MPI call named as C names it."""
    python = tuple((f.function, f.file, f.line) for f in stack.frames if f.kind == PYTHON)
    return (stack.state, mpi_name(innermost_function(stack.frames)), python)


def group_stacks(stacks) -> list[Group]:
    """Ranks with the same signature together; the largest group first (then the lowest rank). A rank
    without native frames joins a group whose ranks have them and are at the same Python lines in the
    same MPI call: under load py-spy's --native fails for some ranks, and 2 of 4 ranks in a barrier
    without their native frames made the barrier a minority (no rank stood out)."""
    by_signature: dict[tuple, list[RankStack]] = {}
    for stack in sorted(stacks, key=lambda s: s.rank):
        by_signature.setdefault(signature(stack), []).append(stack)
    native = {}
    for key, members in by_signature.items():
        if any(f.kind == NATIVE for f in members[0].frames):
            native.setdefault(python_signature(members[0]), key)
    for key in list(by_signature):
        members = by_signature[key]
        if members[0].frames and not any(f.kind == NATIVE for f in members[0].frames):
            home = native.get(python_signature(members[0]))
            if home is not None and home != key:
                by_signature[home] = sorted(by_signature[home] + by_signature.pop(key), key=lambda s: s.rank)
    groups = [
        Group([s.rank for s in members], sorted({s.worker for s in members}), members[0])
        for members in by_signature.values()
    ]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0]))


def in_mpi(group: Group) -> bool:
    """Is the group's innermost call an MPI call (native, or mpi4py's ``comm.`` methods)?"""
    return mpi_call(group.stack.frames) is not None or group.function.startswith(("MPI_", "comm.", "Comm."))


def odd_groups(groups: list[Group]) -> list[Group]:
    """The groups that stand out.

    A rank that is stopped, exited, unreachable or missing always does. Of
    the live ones, those outside the group that holds most of them (more than
    half); without such a majority, the groups outside MPI when no more ranks
    are outside than inside it (two ranks: one in MPI_Recv, one sleeping).
    """
    special = [g for g in groups if g.state != RUNNING]
    live = [g for g in groups if g.state == RUNNING]
    n_live = sum(len(g.ranks) for g in live)
    if not live:  # every rank in one non-running state (all stopped, all exited): nobody stands out
        return special if len(special) > 1 else []
    if len(live[0].ranks) * 2 > n_live:
        return special + live[1:]
    outside = [g for g in live if not in_mpi(g)]
    inside = sum(len(g.ranks) for g in live if in_mpi(g))
    if outside and inside and sum(len(g.ranks) for g in outside) <= inside:
        return special + outside
    return special


def describe_state(stack: RankStack) -> str:
    """How a rank that is not simply running is named in the verdict."""
    if stack.state == EXITED:
        return "exited" + (f" with code {stack.exit_code}" if stack.exit_code is not None else "")
    if stack.state == UNREACHABLE:
        return "unreachable" + (f" ({stack.note})" if stack.note else "")
    if stack.state == NOT_FOUND:
        return "not found on its worker" + (f" ({stack.note})" if stack.note else "")
    return stack.state


def describe_place(group: Group) -> str:
    """``in time.sleep at train.py:12``, ``stopped (state T) in ...``, ``exited with code 3``."""
    if group.state not in (RUNNING, STOPPED):
        return describe_state(group.stack)
    if not group.stack.frames:
        text = "in an unknown place" + (f" ({group.stack.note})" if group.stack.note else "")
    else:
        at = group.where
        text = f"in {place_function(group.stack.frames)}" + (f" at {at}" if at else "")
    return f"stopped (state T) {text}" if group.state == STOPPED else text


def _who(group: Group) -> str:
    verb = "is" if len(group.ranks) == 1 else "are"
    return (
        f"{rank_word(group.ranks)} {rank_list(group.ranks)} ({', '.join(group.workers)}) {verb} {describe_place(group)}"
    )


def _others(rest: list[Group]) -> str:
    n = sum(len(g.ranks) for g in rest)
    subject = "the other rank is" if n == 1 else f"the {n} other ranks are"
    if len(rest) == 1:
        return f"{subject} {describe_place(rest[0])}"
    parts = [f"{describe_place(g)} ({len(g.ranks)})" for g in rest[:3]]
    return f"{subject} " + ", ".join(parts) + (", ..." if len(rest) > 3 else "")


def verdict_line(groups: list[Group], odd: list[Group]) -> str:
    if not groups:
        return f"{PREFIX} no rank's stacks could be taken"
    if odd:
        rest = [g for g in groups if g not in odd]
        line = "; ".join(_who(g) for g in odd)
        return f"{PREFIX} {line}" + (f"; {_others(rest)}" if rest else "")
    if len(groups) == 1:
        g = groups[0]
        everyone = "every rank" if len(g.ranks) > 1 else "the only rank"
        return f"{PREFIX} no rank stands out: {everyone} ({rank_list(g.ranks)}) is {describe_place(g)}"
    largest = "; ".join(f"{rank_word(g.ranks)} {rank_list(g.ranks)} {describe_place(g)}" for g in groups[:3])
    return f"{PREFIX} no rank stands out; the largest groups: {largest}"


def diagnose(stacks) -> Diagnosis:
    stacks = list(stacks)
    groups = group_stacks(stacks)
    odd = odd_groups(groups)
    return Diagnosis(groups, odd, verdict_line(groups, odd), stacks)


def report(diagnosis: Diagnosis, collection_s: float | None = None) -> dict:
    """report.json's ``hang`` (the verdict, the groups) and ``stacks`` (every rank's), and what
    ``mpilaunch stacks --json`` prints."""
    hang = diagnosis.to_dict()
    if collection_s is not None:
        hang["collection_s"] = round(collection_s, 3)
    return {"hang": hang, "stacks": [s.to_dict() for s in sorted(diagnosis.ranks, key=lambda s: s.rank)]}


__all__ = [
    "Frame",
    "RankStack",
    "Group",
    "Diagnosis",
    "diagnose",
    "report",
    "PREFIX",
    "RUNNING",
    "STOPPED",
    "EXITED",
    "UNREACHABLE",
    "NOT_FOUND",
]
