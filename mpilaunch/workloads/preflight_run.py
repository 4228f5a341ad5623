"""--preflight: ask every worker the preflight probe through the job's exec channel, judge, report.

Runs once the workers are ready and before the program starts, where the
program would run it (this mpilaunch, or the in-cluster launcher), through
the same channel the shims and the hang probe use (``hang.collect``). A
worker that fails a check is named in one line with its numbers, on its
pod as an Event (Kubernetes), and in the job's record (``preflight``);
``enforce`` then ends the job before its program (EXIT_PREFLIGHT).
"""

from __future__ import annotations

import json
import shlex
import time

from ..backends import protocols
from ..core.errors import PreflightFailed
from ..core.interpreter import interpreter_word
from ..hang import collect
from ..preflight import checks
from .base import RunContext, Workload
from .hang_watch import probe_python

#: the bound on the whole preflight (issue 52: at most 10 s for 16 workers on this machine)
DEADLINE_S = 20.0
EVENT_REASON = "Preflight"


def probe_text() -> str:
    import pkgutil

    return pkgutil.get_data("mpilaunch.preflight", "probe.py").decode()


def probe_command(python: str, budget_s: float) -> str:
    return f"exec {interpreter_word(python)} -c {shlex.quote(probe_text())} --budget {budget_s:.1f}"


def ask(captures: dict, python: str, deadline_s: float) -> tuple[dict, dict, dict]:
    """Every worker's answer (or why none), when it arrived (wall clock) and how long it took."""
    deadline = time.monotonic() + deadline_s
    command = probe_command(python, deadline_s / 2)

    def one(worker, capture):
        t0 = time.monotonic()
        try:
            status, out, err = capture(command, max(0.5, deadline - t0))
        except TimeoutError:
            return f"no answer within {deadline_s:.0f} s", time.time(), time.monotonic() - t0
        except (OSError, ValueError) as e:
            return str(e) or type(e).__name__, time.time(), time.monotonic() - t0
        received, took = time.time(), time.monotonic() - t0
        if status != 0:
            tail = err.decode(errors="replace").strip().splitlines()
            return f"the probe exited {status}" + (f": {tail[-1][:200]}" if tail else ""), received, took
        try:
            return json.loads(out.decode(errors="replace").strip().splitlines()[-1]), received, took
        except (ValueError, IndexError):
            return "the probe's answer was not JSON", received, took

    got = collect.each_worker(captures, one, deadline, what="preflight")
    answers = {w: got[w][0] if w in got else f"no answer within {deadline_s:.0f} s" for w in captures}
    return answers, {w: got[w][1] for w in got}, {w: got[w][2] for w in got}


def nodes_of(backend, verdict: checks.Verdict) -> dict[str, str]:
    """worker -> the node it runs on, as the backend knows it (else the host it answered from)."""
    nodes = {w: (fig.get("host") or "") for w, fig in verdict.figures.items()}
    describe = getattr(backend, "describe_workers", None)
    if describe is not None:
        try:
            nodes.update({w: d["node"] for w, d in describe().items() if d.get("node")})
        except Exception:  # an extra: the host the probe saw is a fine name too
            pass
    return nodes


def run(run: RunContext, workload: Workload) -> dict:
    """Check the workers; print a line per finding (and one summary line); the record's ``preflight``.
    Raises PreflightFailed with ``--preflight enforce`` when a worker failed."""
    spec = run.spec
    t0 = time.monotonic()
    context = json.loads(run.context_file.read_text())
    captures = collect.captures_of(context)
    answers, received, travel = ask(captures, probe_python(run.backend), DEADLINE_S)
    expected = {w.name: w.gpus for w in workload.plan.workers}
    verdict = checks.judge(answers, expected, received, travel, spec.preflight_margin)
    seconds = time.monotonic() - t0
    nodes = nodes_of(run.backend, verdict)
    for finding in verdict.findings:
        line = finding.line(nodes.get(finding.worker))
        print(line, file=run.stderr, flush=True)
        try:
            protocols.report_on_worker(run.backend, finding.worker, EVENT_REASON, line)
        except Exception as e:  # an extra: the line is on stderr and in the record already
            print(f"mpilaunch: warning: the preflight finding was not posted to the cluster: {e}", file=run.stderr)
    if not verdict.findings and not run.quiet:
        median = verdict.medians.get("kernel_s")
        print(
            f"mpilaunch: preflight: {len(answers)} workers passed in {seconds:.1f} s"
            + (f" (compute kernel median {median:.3g} s)" if median else ""),
            file=run.stderr,
            flush=True,
        )
    found = {"mode": spec.preflight, "seconds": round(seconds, 3), **verdict.to_dict()}
    if verdict.findings and spec.preflight == "enforce":
        failed = verdict.failed_workers
        raise PreflightFailed(
            f"preflight: {len(failed)} of {len(answers)} workers failed ({', '.join(failed[:8])}"
            + (", ..." if len(failed) > 8 else "")
            + "); the program was not started",
            "see the 'mpilaunch: preflight:' lines above; --preflight report runs the job anyway",
        ).with_found(found)
    return found
