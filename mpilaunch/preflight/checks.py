"""Judging the workers' preflight answers: against the plan, each other and the asking side's clock.

Pure functions: ``judge`` takes what every worker answered (``probe.py``'s
JSON, or the reason it gave none) and returns the findings, one per worker
and check that failed, each with the numbers behind it, and the figures the
record keeps.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

#: --preflight's values
MODES = ("off", "report", "enforce")
#: a worker this much slower than the median at the fixed kernel (or the link test) is named
DEFAULT_MARGIN = 0.5
#: and at least this much slower in absolute terms: the kernel takes tens of milliseconds, where one
#: descheduled slice on a busy machine is a large fraction (seen: 1 false finding in 12 healthy
#: 4-worker runs at load 11 on 2 cores without it)
MIN_SLOWER_S = 0.05
#: less free scratch space than this in TMPDIR is a finding
MIN_SCRATCH_BYTES = 1 << 30
#: a worker's clock this far from the asking side's (beyond the answer's own travel) is a finding
CLOCK_TOLERANCE_S = 2.0
# clocks_throttle_reasons bits that mean the hardware slows the GPU down (nvidia-smi -q's "HW
# Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown"); idle and
# application-clock settings are not findings
THROTTLE_BITS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}


@dataclass(frozen=True)
class Finding:
    worker: str
    check: str  # gpus, scratch, clock, compute, link, answer
    message: str  # one line, numbers included

    def line(self, node: str | None) -> str:
        where = f"worker {self.worker}" + (f" (node {node})" if node and node != self.worker else "")
        return f"mpilaunch: preflight: {where} {self.message}"


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, dict] = field(default_factory=dict)  # worker -> what it measured
    medians: dict[str, float] = field(default_factory=dict)

    @property
    def failed_workers(self) -> list[str]:
        return sorted({f.worker for f in self.findings})

    def to_dict(self) -> dict:
        return {
            "findings": [asdict(f) for f in self.findings],
            "workers": self.figures,
            "medians": self.medians,
            "failed_workers": self.failed_workers,
        }


def gpu_findings(worker: str, expected: int, answer: dict) -> list[Finding]:
    """The GPUs the plan gives ``worker`` are there and healthy, where it has ``nvidia-smi``."""
    gpus, error = answer.get("gpus"), answer.get("gpu_error")
    if error:
        return [Finding(worker, "gpus", f"GPUs not readable: {error}")]
    if gpus is None:  # no nvidia-smi: nothing to check it with (a CPU job, or an image without it)
        return []
    out = []
    if len(gpus) < expected:
        out.append(Finding(worker, "gpus", f"has {len(gpus)} GPUs, the plan gives it {expected}"))
    for gpu in gpus:
        label = f"GPU {gpu.get('index')} ({gpu.get('name')})"
        if gpu.get("ecc"):
            out.append(Finding(worker, "gpus", f"{label} has {gpu['ecc']} uncorrected ECC errors"))
        slowed = [name for bit, name in THROTTLE_BITS.items() if (gpu.get("throttle") or 0) & bit]
        if slowed:
            out.append(Finding(worker, "gpus", f"{label} is throttled: {', '.join(slowed)}"))
    return out


def scratch_finding(worker: str, answer: dict, min_bytes: int = MIN_SCRATCH_BYTES) -> Finding | None:
    where = answer.get("scratch")
    if answer.get("scratch_error"):
        return Finding(worker, "scratch", f"scratch {where} unusable: {answer['scratch_error']}")
    free = answer.get("scratch_free")
    if free is not None and free < min_bytes:
        return Finding(worker, "scratch", f"scratch {where} has {gib(free)} free, under {gib(min_bytes)}")
    return None


def clock_finding(worker: str, answer: dict, received: float, travel: float) -> Finding | None:
    """The worker read its clock just before answering; on receipt the asking side's clock is at
    most ``travel`` (the whole exchange) later. Outside that window by more than the tolerance: skewed."""
    clock = answer.get("clock")
    if clock is None:
        return None
    skew = clock - received  # in [-travel, 0] for agreeing clocks
    off = skew if skew > 0 else (-skew - travel if -skew > travel else 0.0)
    if off > CLOCK_TOLERANCE_S:
        side = "ahead of" if skew > 0 else "behind"
        return Finding(worker, "clock", f"clock {off:.1f} s {side} this machine's")
    return None


def slow_findings(check: str, values: dict[str, float], margin: float, what: str) -> tuple[list[Finding], float]:
    """Workers whose ``values`` (seconds: higher is worse) exceed the median by more than ``margin``."""
    if len(values) < 2:
        return [], next(iter(values.values()), 0.0)
    median = statistics.median(values.values())
    limit = max(median * (1 + margin), median + MIN_SLOWER_S)
    out = [
        Finding(worker, check, f"{what} {value:.3g} s, median {median:.3g} s (over the {margin:.0%} margin)")
        for worker, value in sorted(values.items())
        if value > limit
    ]
    return out, median


def judge(
    answers: dict[str, dict | str],
    expected_gpus: dict[str, int],
    received: dict[str, float],
    travel: dict[str, float],
    margin: float = DEFAULT_MARGIN,
) -> Verdict:
    """``answers``: worker -> the probe's answer, or why there is none (a string);
    ``expected_gpus``: worker -> the GPUs the plan gives it; ``received``/``travel``: when the
    answer arrived on this side's wall clock and how long the whole exchange took."""
    verdict = Verdict()
    kernels: dict[str, float] = {}
    for worker in sorted(answers):
        answer = answers[worker]
        if isinstance(answer, str):
            verdict.findings.append(Finding(worker, "answer", f"did not answer the preflight probe: {answer}"))
            continue
        verdict.findings += gpu_findings(worker, expected_gpus.get(worker, 0), answer)
        for found in (
            scratch_finding(worker, answer),
            clock_finding(worker, answer, received.get(worker, 0.0), travel.get(worker, 0.0)),
        ):
            if found is not None:
                verdict.findings.append(found)
        if isinstance(answer.get("kernel_s"), (int, float)):
            kernels[worker] = float(answer["kernel_s"])
        verdict.figures[worker] = {
            "host": answer.get("host"),
            "gpus": len(answer["gpus"]) if answer.get("gpus") is not None else None,
            "scratch_free": answer.get("scratch_free"),
            "kernel_s": answer.get("kernel_s"),
            "clock_skew_s": round(answer["clock"] - received.get(worker, 0.0), 3) if answer.get("clock") else None,
        }
    slow, median = slow_findings("compute", kernels, margin, "compute kernel")
    verdict.findings += slow
    if kernels:
        verdict.medians["kernel_s"] = round(median, 4)
    return verdict


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 27 else f"{n / (1 << 20):.1f} MiB"


#: a ring link slower than the median link by more than the margin is named only when its 1 MiB
#: also takes this much longer: what a loaded machine's scheduler costs two ranks now and then
#: (seen: 3 ms, twice in 9 healthy 6-worker runs at load 8-11 on 2 cores, with the quiet waits and
#: the second look). A broken link (a port at 100 Mb/s, loss, a saturated uplink) is far beyond it;
#: a link 20% slower than its peers is not found here (--straggler-report sees what it costs).
MIN_LINK_SLOWER_S = 0.02


def gbps(nbytes: int, seconds: float | None) -> float | None:
    return None if not seconds else nbytes / seconds / 1e9


def link_reference(edges: list[float]) -> float:
    """What a good ring link takes (``link_probe.reference``, the same rule where the probe decides
    which links to time again): the median over the workers of each one's faster link."""
    from .link_probe import reference

    return reference(edges)


def judge_links(rows: dict[int, dict], workers: list[str], margin: float, failure: str | None = None) -> Verdict:
    """The link test's findings (``link_probe.py``: rank i ran on ``workers[i]``; ``rows``: rank ->
    its line; ``failure``: why the test itself failed, when it did). Link k goes from worker k to
    worker k+1, each timed alone. A worker both of whose links are slow is named with both; a slow
    link whose ends each have a fast one names both ends ("link to/from"); with two workers
    the one link each way cannot say which end is slow, so both are named."""
    verdict = Verdict()
    missing = [w for i, w in enumerate(workers) if i not in rows]
    if missing:
        why = failure or "no answer"
        for worker in missing:
            verdict.findings.append(Finding(worker, "link", f"took no part in the link test over all workers: {why}"))
        return verdict
    n = len(workers)
    nbytes = int(rows[0].get("bytes") or 0)
    seconds = {k: rows[k].get("edge_s") for k in range(n)}
    times = [s for s in seconds.values() if isinstance(s, (int, float)) and s > 0]
    allreduce = [r.get("allreduce_s") for r in rows.values() if isinstance(r.get("allreduce_s"), (int, float))]
    if allreduce:
        verdict.medians["allreduce_s"] = round(max(allreduce), 6)  # the collective ends with its slowest rank
    if len(times) < n or n < 2:
        return verdict
    median = link_reference([seconds[k] for k in range(n)])
    verdict.medians["link_gbps"] = round(gbps(nbytes, median), 3)
    limit = max(median * (1 + margin), median + MIN_LINK_SLOWER_S)
    slow = {k for k, s in seconds.items() if s > limit}
    for i, worker in enumerate(workers):
        out_s, in_s = seconds[i], seconds[(i - 1) % n]
        verdict.figures[worker] = {
            "link_out_gbps": round(gbps(nbytes, out_s), 3),
            "link_in_gbps": round(gbps(nbytes, in_s), 3),
        }
    named: set[str] = set()
    for i, worker in enumerate(workers):
        if i in slow and (i - 1) % n in slow:  # both of its links
            named.add(worker)
            verdict.findings.append(
                Finding(
                    worker,
                    "link",
                    f"ring links {gbps(nbytes, seconds[(i - 1) % n]):.3g} GB/s in, "
                    f"{gbps(nbytes, seconds[i]):.3g} GB/s out, median {gbps(nbytes, median):.3g} GB/s "
                    f"(over the {margin:.0%} margin)",
                )
            )
    for k in sorted(slow):
        ends = (workers[k], workers[(k + 1) % n])
        if named & set(ends):
            continue
        rate = f"{gbps(nbytes, seconds[k]):.3g} GB/s, median {gbps(nbytes, median):.3g} GB/s (over the {margin:.0%} margin)"
        verdict.findings.append(Finding(ends[0], "link", f"ring link to worker {ends[1]} {rate}"))
        verdict.findings.append(Finding(ends[1], "link", f"ring link from worker {ends[0]} {rate}"))
    return verdict
