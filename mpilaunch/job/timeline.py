"""The page model of a job's timeline (``mpilaunch report NAME --html FILE``), from its report alone.

Pure functions of a report dict, as ``summary.py``'s: every position and
label the page shows is decided here, in pixels, so that the page
(``timeline_page.py``) only draws what it is given and this is what the
unit tests hold. One time axis, seconds since mpilaunch started (the clock
of ``timings.phases``):

* a ``launch`` row: the launch's segments (``summary.time_spent``);
* per worker, its own phases (``timings.workers``: created, scheduled,
  running, ready, as far as its backend sees them) then the time it was held
  until the release; a worker replaced by ``--retries`` shows both;
* under each worker, one row per rank: one bar from its start to its end
  (``ranks[].started_at``/``ended_at``, coloured by how it ended), and an
  earlier attempt's run of it (``attempts[].ranks``) faded in the same row;
* attempts (``--retries``) and a hang (``--stall-timeout``: the silent span
  before it was declared) as bands across the rank rows, a ``--timeout`` as
  a line.
"""

from __future__ import annotations

import calendar
import math
import time

from ..runtime import summary

WIDTH = 1200  # the drawing, in pixels
LEFT = 190  # the labels' column
RIGHT = 20
TOP = 34  # room for the axis' labels
ROW = 18  # one row's height (ranks' rows, above 64 of them: RANK_ROW_LARGE, above 1024: RANK_ROW_HUGE)
RANK_ROW_LARGE = 8
RANK_ROW_HUGE = 3  # 8192 ranks: a page 25,000 pixels tall rather than 66,000
HUGE_JOB = 1024
BAR = 12  # a bar's height in its row
LARGE_JOB = 64
TEXT_PX = 6.5  # about one character's width at the page's 11px

#: a worker's segment, named after the phase that ends it: (class, label)
WORKER_ENDS = {
    "scheduled": ("queue", "waiting for the scheduler"),
    "running": ("pull", "image pull and container start"),
    "ready": ("agent", "agent start"),
}
#: every class the page colours, and the legend's words for it, in the legend's order
LEGEND = {
    "queue": "worker: waiting for the scheduler",
    "pull": "worker: image pull and container start",
    "agent": "worker: starting (agent, exec channel)",
    "held": "worker: held, ready",
    "ok": "rank: ran, exited 0",
    "failed": "rank: ran, exited non-zero",
    "unended": "rank: no exit seen (stopped, lost, still running)",
    "earlier": "rank: an earlier attempt's run",
    "earlier-failed": "rank: an earlier attempt's run, exited non-zero",
    "attempt": "attempt (--retries)",
    "hang": "hang: no output until declared hung (--stall-timeout)",
    "timeout": "--timeout reached",
    "l-allocate": "launch: planning and creating the workers",
    "l-mpirun": "launch: mpirun starting, and exiting after the ranks",
    "l-wireup": "launch: wire-up (mpirun's daemons, until the first rank started)",
    "l-run": "launch: the ranks running",
    "l-release": "launch: releasing the workers",
}
#: the launch row's segments (summary.ENDS' labels) and their classes
LAUNCH_CLASSES = {
    "allocate": "l-allocate",
    "schedule": "queue",
    "start containers": "pull",
    "launcher": "pull",
    "ready": "agent",
    "mpirun": "l-mpirun",
    "wire-up": "l-wireup",
    "run": "l-run",
    "mpirun exit": "l-mpirun",
    "release": "l-release",
    "until released": "l-release",
}


def iso_seconds(text: str | None) -> float | None:
    """``2026-12-06T23:35:00.123Z`` (``record.iso_utc``) as epoch seconds; None for None or garbage."""
    if not text:
        return None
    try:
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    frac = text[19:].rstrip("Z")
    return whole + (float(frac) if frac.startswith(".") and frac[1:].isdigit() else 0.0)


def rank_spans(report: dict) -> dict[int, tuple[float | None, float | None]]:
    """rank -> (start, end) in seconds on the report's clock, from its ISO times; None where unknown."""
    origin = iso_seconds(report.get("started_at"))
    out = {}
    for r in report.get("ranks") or ():
        times = [iso_seconds(r.get(k)) for k in ("started_at", "ended_at")]
        out[r["rank"]] = tuple(None if origin is None or t is None else round(t - origin, 3) for t in times)
    return out


def attempt_of(phase: str) -> tuple[str, int | None]:
    """``ready#1`` -> ("ready", 1): a replaced worker's earlier phases (``phases.retire_worker``)."""
    name, _, attempt = phase.partition("#")
    return name, (int(attempt) if attempt.isdigit() else None)


def worker_segments(times: dict[str, float], until: float, start: float | None = None) -> list[dict]:
    """One worker's bars: from its first phase, a segment ending at each later one (``WORKER_ENDS``),
    then ``held`` until ``until`` (the release, or the next incarnation of the worker)."""
    ordered = sorted(((at, p) for p, at in times.items() if p in ("created", *WORKER_ENDS)), key=lambda x: x[0])
    out, at = [], start
    for moment, phase in ordered:
        if phase != "created" and at is not None and phase in WORKER_ENDS:
            cls, label = WORKER_ENDS[phase]
            out.append({"start": at, "end": moment, "cls": cls, "title": f"{label}: {moment - at:.2f}s"})
        at = moment
    if "ready" in times and until >= times["ready"]:
        out.append(
            {
                "start": times["ready"],
                "end": until,
                "cls": "held",
                "title": f"held, ready: {until - times['ready']:.2f}s",
            }
        )
    return out


def worker_bars(times: dict[str, float], end: float, allocated: float | None) -> list[dict]:
    """Every incarnation of a worker (``--retries`` replaced it: ``<phase>#<attempt>``), oldest first."""
    groups: dict[int | None, dict[str, float]] = {}
    for phase, at in times.items():
        name, attempt = attempt_of(phase)
        groups.setdefault(attempt, {})[name] = at
    order = sorted(groups, key=lambda a: (a is None, a or 0))
    bars = []
    for i, attempt in enumerate(order):
        later = groups[order[i + 1]] if i + 1 < len(order) else None
        until = min(later.values()) if later else end
        start = groups[attempt].get("created", allocated if i == 0 else None)
        bars += worker_segments(groups[attempt], until, start)
    return bars


def rank_bar(rank: int, span: tuple, exit_code, end: float, attempt: int | None = None) -> dict | None:
    """A rank's run; None when it never started. Without an end: drawn until ``end``, ``unended``."""
    start, stop = span
    if start is None:
        return None
    if attempt is not None:  # an earlier attempt's run, faded; red where it failed
        stop = end if stop is None else stop
        how = "no exit seen" if exit_code is None else f"exit {exit_code}"
        return {
            "start": start,
            "end": stop,
            "cls": "earlier-failed" if exit_code not in (None, 0) else "earlier",
            "rank": rank,
            "title": f"rank {rank}, attempt {attempt}: {start:.2f}s to {stop:.2f}s, {how}",
        }
    if stop is None:
        cls, how = "unended", "no exit seen"
        stop = end
    else:
        cls, how = ("ok", "exit 0") if exit_code == 0 else ("failed", f"exit {exit_code}")
    return {
        "start": start,
        "end": stop,
        "cls": cls,
        "rank": rank,
        "title": f"rank {rank}: {start:.2f}s to {stop:.2f}s ({stop - start:.2f}s), {how}",
    }


def tick_step(total: float, wanted: int = 10) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving at most about ``wanted`` ticks over ``total``."""
    raw = max(total, 1e-3) / wanted
    power = 10.0 ** math.floor(math.log10(raw))
    return next(power * m for m in (1, 2, 5, 10) if power * m >= raw * 0.999)


def axis(total: float, scale: float) -> list[dict]:
    step = tick_step(total)
    digits = 0 if step >= 1 else len(f"{step:.6f}".rstrip("0").split(".")[1])
    ticks, n = [], 0
    while n * step <= total + 1e-9:
        ticks.append({"x": round(LEFT + n * step * scale, 1), "label": f"{n * step:.{digits}f}s"})
        n += 1
    return ticks


def launch_bars(phases: dict) -> list[dict]:
    """The launch row: ``summary.time_spent``'s segments end to end, each labelled where it fits."""
    out, at = [], 0.0
    for label, seconds in summary.time_spent(phases):
        cls = LAUNCH_CLASSES.get(label, "l-other")
        out.append({"start": at, "end": at + seconds, "cls": cls, "title": f"{label}: {seconds:.2f}s", "text": label})
        at += seconds
    return out


def earlier_runs(attempts: list[dict], end: float) -> dict[int, list[dict]]:
    """rank -> its runs in the attempts before the last (``attempts[].ranks``), faded bars."""
    out: dict[int, list[dict]] = {}
    for a in attempts[:-1]:
        for rank, *run in a.get("ranks") or ():
            run += [None] * (3 - len(run))  # [started_s, ended_s, exit code]
            bar = rank_bar(rank, tuple(run[:2]), run[2], a.get("ended_s") or end, attempt=a["attempt"])
            if bar:
                out.setdefault(rank, []).append(bar)
    return out


def model(report: dict) -> dict:
    """Everything the page draws, placed: rows of bars, bands, the axis, the legend, the summary."""
    phases = (report.get("timings") or {}).get("phases") or {}
    workers_times = (report.get("timings") or {}).get("workers") or {}
    spans = rank_spans(report)
    attempts = report.get("attempts") or []
    ends = [v for v in phases.values()] + [e for s in spans.values() for e in s if e is not None]
    ends += [t for w in workers_times.values() for t in w.values()] + [a.get("ended_s") or 0 for a in attempts]
    end = max(ends + [0.0]) or 1.0
    # where a rank with no exit seen is drawn to: the end of the last attempt (workload_done is the first's)
    run_end = attempts[-1].get("ended_s") if attempts else None
    run_end = run_end or phases.get("workload_done", phases.get("released", end))
    plan = report.get("plan") or {}
    workers = [w["name"] for w in plan.get("workers") or ()] or sorted(report.get("workers") or {})
    ranks = report.get("ranks") or []
    on_worker: dict[str, list[dict]] = {w: [] for w in workers}
    for r in ranks:
        on_worker.setdefault(r.get("worker") or "?", []).append(r)
    earlier = earlier_runs(attempts, end)

    rank_row = ROW if len(ranks) <= LARGE_JOB else RANK_ROW_LARGE if len(ranks) <= HUGE_JOB else RANK_ROW_HUGE
    scale = (WIDTH - LEFT - RIGHT) / end
    rows: list[dict] = []
    y = TOP

    def add(kind: str, label: str, bars: list[dict], height: int, note: str = "") -> None:
        nonlocal y
        bar_h = min(BAR, max(2, height - 2))
        placed = []
        for b in bars:
            w = max(1.0, (b["end"] - b["start"]) * scale)
            bar = {**b, "x": round(LEFT + b["start"] * scale, 1), "w": round(w, 1), "y": y + (height - bar_h) // 2}
            bar["h"] = bar_h
            if "text" in b and w < TEXT_PX * len(b["text"]) + 6:  # the label only where it fits in the bar
                del bar["text"]
            placed.append(bar)
        rows.append(
            {
                "kind": kind,
                "label": label,
                "y": y,
                "h": height,
                "text_y": y + height // 2 + 4,
                "bars": placed,
                "note": note,
            }
        )
        y += height

    launch = launch_bars(phases)
    if len(attempts) > 1 or "hang_found" in phases or "timed_out" in phases:
        add("marks", "", [], ROW)  # a row of its own for the bands' and lines' labels
    add("launch", "launch", launch, ROW + 4)
    first_rank_y = None
    for w in workers + [w for w in on_worker if w not in workers]:  # "?": a rank that never said where
        add(
            "worker",
            w,
            worker_bars(workers_times.get(w) or {}, phases.get("released", end), phases.get("allocated")),
            ROW,
        )
        for r in sorted(on_worker.get(w) or [], key=lambda r: r["rank"]):
            if first_rank_y is None:
                first_rank_y = y
            bars = list(earlier.get(r["rank"], []))
            final = rank_bar(r["rank"], spans.get(r["rank"], (None, None)), r.get("exit_code"), run_end)
            bars += [final] if final else []
            add("rank", f"rank {r['rank']}", bars, rank_row, "" if final else "never started")
    bottom = y
    top = first_rank_y if first_rank_y is not None else TOP

    bands = []
    if len(attempts) > 1:
        for a in attempts:
            x0, x1 = LEFT + a["started_s"] * scale, LEFT + (a.get("ended_s") or end) * scale
            bands.append(
                {
                    "x": round(x0, 1),
                    "w": round(max(1.0, x1 - x0), 1),
                    "y": TOP,
                    "h": bottom - TOP,
                    "label_y": TOP + 13,
                    "cls": "attempt",
                    "label": f"attempt {a['attempt']}: exit {a.get('exit_code')}",
                    "title": a.get("failure") or f"attempt {a['attempt']} succeeded",
                }
            )
    hang = report.get("hang") or {}
    if "hang_found" in phases and ("stalled" in phases or hang.get("stall_timeout_s")):
        # from when the output stopped (a record before "stalled": the stall timeout back from the verdict)
        found = phases["hang_found"]
        silent = phases.get("stalled", found - float(hang.get("stall_timeout_s") or 0))
        x0 = LEFT + max(0.0, silent) * scale
        bands.append(
            {
                "x": round(x0, 1),
                "w": round(max(1.0, LEFT + found * scale - x0), 1),
                "y": top,
                "h": bottom - top,
                "label_y": TOP + 13,
                "cls": "hang",
                "label": "hang",
                "title": hang.get("verdict") or f"no output for {found - silent:.1f}s, then declared hung",
            }
        )
    lines = []
    if "timed_out" in phases:
        lines.append(
            {
                "x": round(LEFT + phases["timed_out"] * scale, 1),
                "y1": TOP,
                "y2": bottom,
                "label_y": TOP + 13,
                "cls": "timeout",
                "label": "--timeout",
            }
        )

    used = {b["cls"] for row in rows for b in row["bars"]} | {b["cls"] for b in bands} | {ln["cls"] for ln in lines}
    return {
        "title": f"mpilaunch: job {report.get('job')}",
        "summary": [line for line in summary.lines(report)],
        "width": WIDTH,
        "height": bottom + 10,
        "left": LEFT,
        "axis": axis(end, scale),
        "axis_y": TOP - 8,
        "rows": rows,
        "bands": bands,
        "lines": lines,
        "legend": [{"cls": c, "label": label} for c, label in LEGEND.items() if c in used],
        "ranks": len(ranks),
    }
