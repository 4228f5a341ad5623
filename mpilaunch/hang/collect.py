"""Every rank's stacks, through the workers' exec channels, all workers at once, within a deadline.

One exec session per worker (the shim's transport: the workers' agents, or
the Kubernetes exec API) runs ``probe`` (sent as text: any image with a
python3 runs it) and answers with that worker's ranks. The ranks are then
matched against what the caller expects (the plan's rank -> worker, the
exits mpilaunch already saw): a rank its worker did not report is exited
(with its code, where known) or not found; every rank of a worker that did
not answer within the deadline is unreachable.
"""

from __future__ import annotations

import functools
import json
import os
import pkgutil
import shlex
import threading
import time
from dataclasses import dataclass, field

from ..core import env_names
from ..core.interpreter import interpreter_word
from . import DEFAULT_DEADLINE_S
from .verdict import EXITED, NOT_FOUND, RUNNING, STOPPED, UNREACHABLE, Frame, RankStack

# what a worker's probe leaves for its answer to travel back
_PROBE_MARGIN_S = 1.5


def probe_text() -> str:
    """The probe's source (pkgutil: it also reads it from the zip mpilaunch ships to pods)."""
    return pkgutil.get_data(__package__, "probe.py").decode()


# MPILAUNCH_PY_SPY=none where mpilaunch runs: the workers' probes take the fallback too (the
# variable itself reaches only the local backend's agents)
NO_PY_SPY = "none"


def probe_command(python: str, budget_s: float, py_spy: str | None = None) -> str:
    if py_spy is None and os.environ.get(env_names.PY_SPY) == NO_PY_SPY:
        py_spy = NO_PY_SPY
    # the interpreter comes from a context file or a launch description: one quoted word, or refused
    command = f"exec {interpreter_word(python)} -c {shlex.quote(probe_text())} --budget {budget_s:.1f}"
    return command + (f" --py-spy {shlex.quote(py_spy)}" if py_spy else "")


@dataclass
class WorkerAnswer:
    worker: str
    ranks: list[dict] = field(default_factory=list)
    error: str | None = None  # unreachable, or the probe failed: why
    seconds: float = 0.0
    tool: str = ""


@dataclass
class Collection:
    stacks: list[RankStack]
    answers: dict[str, WorkerAnswer]
    seconds: float


def ask_worker(worker: str, capture, python: str, deadline: float, py_spy: str | None = None) -> WorkerAnswer:
    """``capture(command, timeout)``: the worker's exec channel (a transport's ``capture``)."""
    t0 = time.monotonic()
    left = deadline - t0
    answer = WorkerAnswer(worker)
    try:
        status, out, err = capture(probe_command(python, max(0.5, left - _PROBE_MARGIN_S), py_spy), max(0.5, left))
        if status != 0:
            tail = err.decode(errors="replace").strip().splitlines()
            answer.error = f"its probe exited {status}" + (f": {tail[-1][:200]}" if tail else "")
        else:
            data = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
            answer.ranks, answer.tool = list(data.get("ranks") or ()), str(data.get("tool") or "")
    except TimeoutError:
        answer.error = f"no answer within {left:.0f} s"
    except (OSError, ValueError, IndexError) as e:  # AgentError is a ConnectionError
        answer.error = str(e) or type(e).__name__
    answer.seconds = time.monotonic() - t0
    return answer


def ask_all(
    captures: dict, python: str, deadline_s: float = DEFAULT_DEADLINE_S, py_spy: str | None = None
) -> dict[str, WorkerAnswer]:
    """{worker: its answer}, every worker asked at once (``captures``: worker -> its exec channel's
    ``capture(command, timeout)``); none waited for past ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    answers = each_worker(captures, lambda name, capture: ask_worker(name, capture, python, deadline, py_spy), deadline)
    for name in captures:
        answers.setdefault(name, WorkerAnswer(name, error=f"no answer within {deadline_s:.0f} s"))
    return answers


def each_worker(captures: dict, ask, deadline: float, what: str = "stacks") -> dict:
    """{worker: ``ask(worker, capture)``} for every worker at once, one thread each; a worker whose
    ``ask`` is still running at ``deadline`` (monotonic) is left out."""
    answers: dict = {}

    def one(name, capture):
        answers[name] = ask(name, capture)

    threads = [
        threading.Thread(target=one, args=item, daemon=True, name=f"{what}-{item[0]}")
        for item in sorted(captures.items())
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 0.5)
    return dict(answers)


def rank_stack(worker: str, found: dict) -> RankStack:
    state = found.get("state")
    state = {"running": RUNNING, "stopped": STOPPED, "exited": EXITED}.get(state, RUNNING)
    return RankStack(
        int(found["rank"]),
        worker,
        state,
        tuple(Frame.from_dict(f) for f in found.get("frames") or ()),
        pid=found.get("pid"),
        note=str(found.get("note") or ""),
        tool=str(found.get("tool") or ""),
    )


def rank_stacks(
    answers: dict[str, WorkerAnswer], expected: dict[int, str] | None = None, exits: dict[int, int] | None = None
) -> list[RankStack]:
    """The workers' answers as one RankStack per rank.

    ``expected``: rank -> worker (the plan); without it, ranks 0..size-1 as
    the wrappers report the job's size. ``exits``: rank -> exit code of the
    ranks that already reported their end.
    """
    exits = exits or {}
    found: dict[int, RankStack] = {}
    size = 0
    for worker, answer in answers.items():
        for item in answer.ranks:
            stack = rank_stack(worker, item)
            if stack.state == EXITED or stack.rank in exits:
                stack = RankStack(stack.rank, worker, EXITED, exit_code=exits.get(stack.rank))
            found[stack.rank] = stack
            size = max(size, int(item.get("size") or 0), stack.rank + 1)
    if expected is None:
        expected = {r: found[r].worker if r in found else "?" for r in range(size)}
    out = []
    for rank, worker in sorted(expected.items()):
        if rank in found:
            out.append(found[rank])
            continue
        answer = answers.get(worker)
        if answer is not None and answer.error:
            out.append(RankStack(rank, worker, UNREACHABLE, note=answer.error))
        elif rank in exits:
            out.append(RankStack(rank, worker, EXITED, exit_code=exits[rank]))
        else:
            out.append(RankStack(rank, worker, NOT_FOUND))
    out += [s for r, s in sorted(found.items()) if r not in expected]
    return out


def collect(
    captures: dict,
    python: str,
    *,
    expected: dict[int, str] | None = None,
    exits: dict[int, int] | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    py_spy: str | None = None,
) -> Collection:
    """Every rank's stacks: ``captures`` is worker -> its exec channel's ``capture(command, timeout)``,
    ``python`` how a worker runs python3."""
    t0 = time.monotonic()
    answers = ask_all(captures, python, deadline_s, py_spy)
    return Collection(rank_stacks(answers, expected, exits), answers, time.monotonic() - t0)


def captures_of(context: dict) -> dict:
    """worker -> ``capture(command, timeout)`` through the context's transport (the shim's: its
    agents, or the Kubernetes exec API), each worker as the context names it."""
    from ..rsh_agent.shim import load_transport

    transport = load_transport(context.get("transport") or "agent")
    if not hasattr(transport, "capture"):
        raise ValueError(f"the {context.get('transport')} transport cannot run the stacks probe")
    return {
        name: functools.partial(transport.capture, context, worker)
        for name, worker in (context.get("workers") or {}).items()
    }


def collect_from_context(context: dict, python: str, **kwargs) -> Collection:
    """``collect`` for a job's context file (``lifecycle.write_context``: its transport, its workers)."""
    return collect(captures_of(context), python, **kwargs)
