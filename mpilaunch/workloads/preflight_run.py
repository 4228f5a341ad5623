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

from ..backends.cluster_notes import post_on_worker
from ..core.errors import PreflightFailed
from ..core.interpreter import interpreter_word
from ..hang import collect
from ..preflight import checks
from . import preflight_links
from .base import RunContext, Workload
from .hang_watch import probe_python

#: the bound on the workers' answers (issue 52: at most 10 s for 16 workers on this machine)
DEADLINE_S = 20.0
#: the kernel's runs on a worker found slow, before it is named
SECOND_LOOK_ROUNDS = 9
#: the bound on the link test across them (an mpirun launch, then one link at a time)
LINK_DEADLINE_S = 60.0
EVENT_REASON = "Preflight"


def probe_text() -> str:
    import pkgutil

    return pkgutil.get_data("mpilaunch.preflight", "probe.py").decode()


def probe_command(python: str, budget_s: float, rounds: int = 3) -> str:
    said = f"exec {interpreter_word(python)} -c {shlex.quote(probe_text())} --budget {budget_s:.1f}"
    return said + (f" --rounds {rounds}" if rounds != 3 else "")


def ask(captures: dict, python: str, deadline_s: float, rounds: int = 3) -> tuple[dict, dict, dict]:
    """Every worker's answer (or why none), when it arrived (wall clock) and how long it took."""
    deadline = time.monotonic() + deadline_s
    command = probe_command(python, deadline_s / 2, rounds)

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


def add_links(verdict: checks.Verdict, run: RunContext, workload) -> None:
    """The link test across the workers, under the job's mpirun, into ``verdict``."""
    rows, failure, seconds = preflight_links.measure(run, workload, LINK_DEADLINE_S, run.spec.preflight_margin)
    links = checks.judge_links(rows, [w.name for w in workload.plan.workers], run.spec.preflight_margin, failure)
    verdict.findings += links.findings
    for worker, measured in links.figures.items():
        verdict.figures.setdefault(worker, {}).update(measured)
    verdict.medians.update(links.medians)
    verdict.medians["link_test_s"] = round(seconds, 3)


def figures(verdict: checks.Verdict) -> str:
    """`` (compute kernel median 0.031 s, ring links median 1.9 GB/s, allreduce 1 MiB 0.8 ms)``."""
    said = []
    if verdict.medians.get("kernel_s"):
        said.append(f"compute kernel median {verdict.medians['kernel_s']:.3g} s")
    if verdict.medians.get("link_gbps"):
        said.append(f"ring links median {verdict.medians['link_gbps']:.3g} GB/s")
    if verdict.medians.get("allreduce_s") is not None:
        said.append(f"allreduce {preflight_links.LINK_BYTES >> 20} MiB {verdict.medians['allreduce_s'] * 1000:.3g} ms")
    return f" ({', '.join(said)})" if said else ""


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
    python = probe_python(run.backend)
    answers, received, travel = ask(captures, python, DEADLINE_S)
    expected = {w.name: w.gpus for w in workload.plan.workers}
    verdict = checks.judge(answers, expected, received, travel, spec.preflight_margin)
    slow = sorted({f.worker for f in verdict.findings if f.check == "compute"})
    if slow:  # a second look, longer: a moment of load passes (seen at load 20), a slow worker stays slow
        again, _, _ = ask({w: captures[w] for w in slow}, python, DEADLINE_S, rounds=SECOND_LOOK_ROUNDS)
        for worker, answer in again.items():
            if isinstance(answer, dict) and isinstance(answer.get("kernel_s"), (int, float)):
                answers[worker]["kernel_s"] = min(answers[worker]["kernel_s"], answer["kernel_s"])
        verdict = checks.judge(answers, expected, received, travel, spec.preflight_margin)
    # the link test across the workers; not where --preflight enforce already has a worker to stop the
    # job for (or swap): a starved worker holds every rank of the ring up, and the verdict is decided
    if (
        workload.mode == "mpirun"
        and len(workload.plan.workers) > 1
        and not (verdict.findings and spec.preflight == "enforce")
    ):
        add_links(verdict, run, workload)
    seconds = time.monotonic() - t0
    nodes = nodes_of(run.backend, verdict)
    for finding in verdict.findings:
        line = finding.line(nodes.get(finding.worker))
        print(line, file=run.stderr, flush=True)
        try:
            post_on_worker(run.backend, finding.worker, EVENT_REASON, line)
        except Exception as e:  # an extra: the line is on stderr and in the record already
            print(f"mpilaunch: warning: the preflight finding was not posted to the cluster: {e}", file=run.stderr)
    if not verdict.findings and not run.quiet:
        print(
            f"mpilaunch: preflight: {len(answers)} workers passed in {seconds:.1f} s{figures(verdict)}",
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
