"""The closing summary of a job, from its report alone: what every job prints at its end and
what ``mpilaunch report`` prints again, one record or two side by side.

Pure functions of a report dict (``lifecycle.run_job`` builds it, ``record.py`` keeps it), so a
record written by an earlier run reads the same as the run's own ending. The summary goes on
stderr after the progress bar has gone (``WaitProgress`` is transient on a terminal), so it is
what stays on screen: a few lines, or one with ``-q``.
"""

from __future__ import annotations

from ..core.artifacts import format_size

#: the segment of the launch that ends at each phase (``core/phases.py``, report.json's
#: ``timings.phases``); a phase not here (first_output) is a moment, not a boundary
ENDS = {
    "allocated": "allocate",
    "pods_scheduled": "schedule",
    "containers_running": "start containers",
    "launcher_running": "launcher",
    "workers_ready": "ready",
    "preflight_done": "preflight",
    "mpirun_started": "mpirun",
    "first_rank_start": "wire-up",
    "ranks_done": "run",
    "workload_done": "run",  # "mpirun exit" after ranks_done: mpirun tearing its daemons down
    "released": "release",
}
MPI_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI"}
#: nodes named in the summary; more are counted
SHOWN_NODES = 3


def seconds(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def time_spent(phases: dict) -> list[tuple[str, float]]:
    """(segment, seconds) of the launch, in order, from the phases' moments (earliest first)."""
    out, previous, at = [], None, 0.0
    for phase, moment in phases.items():
        label = ENDS.get(phase)
        if label is None:
            continue
        if phase == "workload_done" and previous == "ranks_done":
            label = "mpirun exit"
        elif phase == "released" and previous not in ("workload_done", "ranks_done"):
            label = "until released"  # the job ended before its workload ran (allocation failed)
        out.append((label, max(0.0, moment - at)))
        previous, at = phase, moment
    return out


def verdict(report: dict) -> str:
    code = report.get("exit_code")
    return "succeeded" if code == 0 else f"failed (exit {code})"


def why(report: dict) -> str:
    """The failure's first line (it names the failing rank, lost worker or timeout), or ''."""
    failure = (report.get("failure") or "").strip()
    return failure.splitlines()[0] if failure else ""


def mpi_text(report: dict) -> str | None:
    mpi = report.get("mpi") or {}
    if not mpi.get("flavour"):
        return None
    return f"{MPI_NAMES.get(mpi['flavour'], mpi['flavour'])} {mpi.get('version') or ''}".strip()


def units_text(report: dict) -> str:
    """``4 ranks on 2 workers`` (PS: ``5 tasks on 5 workers``)."""
    plan = report.get("plan") or {}
    listed = plan.get("workers") or ()
    # a compact report (``compact``) counts its workers rather than naming them
    workers = (listed if isinstance(listed, int) else len(listed)) or len(report.get("workers") or ())
    if report.get("mode") == "ps":
        count, unit = len(report.get("tasks") or ()), "task"
    else:
        count, unit = plan.get("ranks", len(report.get("ranks") or ())), "rank"
    return f"{count} {unit}{'s' if count != 1 else ''} on {workers} worker{'s' if workers != 1 else ''}"


def nodes_text(nodes: list, count: int | None = None) -> str | None:
    """``2 nodes: n1, n2``; ``count``: how many there were, where ``nodes`` lists only the first."""
    count = len(nodes) if count is None else count
    if not nodes:
        return None
    shown = ", ".join(nodes[:SHOWN_NODES]) + (", ..." if count > SHOWN_NODES else "")
    return f"{count} node{'s' if count != 1 else ''}: {shown}"


def total_seconds(report: dict) -> float | None:
    """The job's whole time: planning to release (``released``, the phases' clock), else
    ``total_s`` (allocation to release)."""
    timings = report.get("timings") or {}
    return (timings.get("phases") or {}).get("released", timings.get("total_s"))


def head(report: dict) -> str:
    total = total_seconds(report)
    kind = "PS job" if report.get("mode") == "ps" else "job"
    line = f"mpilaunch: {kind} {report.get('job')} {verdict(report)} in {seconds(total)}"
    reason = why(report)
    return f"{line}: {reason}" if reason and report.get("exit_code") != 0 else line


# ------------------------------------------------------------------ the ledger

#: where the allocation went, in this order (``ledger``)
LEDGER = ("queue", "start", "preflight", "wire-up", "program", "hang", "failed attempts", "release")


def ledger(report: dict) -> dict | None:
    """Where the allocation went: worker-seconds (GPU-seconds for a GPU job) held from the moment
    every worker was created (``allocated``) until they were released, split into queueing for
    the scheduler (``pods_scheduled``), starting them (image pulls, containers, agents: until
    ``workers_ready``), wire-up (mpirun and its daemons, until the first rank started), the
    program, a hang (``--stall-timeout``'s stalled span), failed attempts (``--retries``: from
    the first attempt's start to the last one's) and release (mpirun's teardown after the
    ranks ended, and the release itself). The parts add up to the whole; None without phases.
    """
    phases = (report.get("timings") or {}).get("phases") or {}
    start, end = phases.get("allocated"), phases.get("released")
    if start is None or end is None:
        return None
    plan = report.get("plan") or {}
    gpus = plan.get("gpus") or 0
    count = gpus or len(plan.get("workers") or ()) or 1
    ready = min(max(phases.get("workers_ready", end), start), end)
    scheduled = min(max(phases.get("pods_scheduled", start), start), ready)
    done = min(max(phases.get("workload_done", ready), ready), end)
    spans = dict.fromkeys(LEDGER, 0.0)
    spans["queue"] = scheduled - start
    spans["start"] = ready - scheduled
    checked = min(max(phases.get("preflight_done", ready), ready), end)
    spans["preflight"] = checked - ready  # --preflight: the workers checked, the program not yet started
    ready, done = checked, max(done, checked)
    spans["release"] = end - done
    attempts = report.get("attempts") or []
    if len(attempts) > 1:
        spans["failed attempts"] = min(max(0.0, attempts[-1]["started_s"] - attempts[0]["started_s"]), done - ready)
        spans["program"] = done - ready - spans["failed attempts"]  # the last attempt's wire-up included
    else:
        first = min(max(phases.get("first_rank_start", done), ready), done)
        ranks_done = min(max(phases.get("ranks_done", done), first), done)
        spans["wire-up"] = first - ready
        spans["program"] = ranks_done - first
        spans["release"] += done - ranks_done  # mpirun tearing its daemons down
    stalled = ((report.get("hang") or {}).get("stall_timeout_s")) or 0.0
    spans["hang"] = min(stalled, spans["program"])
    spans["program"] -= spans["hang"]
    return {
        "unit": "gpu_seconds" if gpus else "worker_seconds",
        "count": count,
        "allocated": round(count * (end - start), 3),
        **{k.replace(" ", "_").replace("-", "_"): round(count * v, 3) for k, v in spans.items()},
    }


def ledger_line(book: dict | None) -> str | None:
    """``  ledger: 12.4 worker-s held: start 0.3 (2%), wire-up 1.8 (15%), program 9.6 (77%), ...``"""
    if not book or book["allocated"] <= 0:
        return None
    unit = "GPU-s" if book["unit"] == "gpu_seconds" else "worker-s"
    parts = []
    for label in LEDGER:
        value = book.get(label.replace(" ", "_").replace("-", "_"), 0.0)
        if value > 0:
            parts.append(f"{label} {value:.1f} ({100 * value / book['allocated']:.0f}%)")
    return f"  ledger: {book['allocated']:.1f} {unit} held: " + ", ".join(parts)


def lines(report: dict, record: str | None = None) -> list[str]:
    """The summary: the verdict, what ran where, where the time went, where the record is."""
    facts = [units_text(report), nodes_text(report.get("nodes") or [], report.get("node_count")), mpi_text(report)]
    if report.get("image"):
        digest = report.get("image_digest")
        facts.append(f"image {report['image']}" + (f" ({digest[:19]})" if digest else ""))
    facts.append(f"backend {report.get('backend')}")
    out = [head(report), "  " + "; ".join(f for f in facts if f)]
    out += task_table(report.get("tasks") or [])
    spent = time_spent((report.get("timings") or {}).get("phases") or {})
    if spent:
        out.append("  time: " + ", ".join(f"{label} {seconds(s)}" for label, s in spent))
    book = ledger_line(report.get("ledger"))
    if book:
        out.append(book)
    files = collected_text(report)
    if files:
        out.append(f"  collected: {files}")
    if record:
        out.append(f"  record: {record}")
    return out


def one_line(report: dict, record: str | None = None) -> str:
    """``-q``: the verdict, what --collect brought back and the record in one line."""
    line = head(report) if report.get("exit_code") != 0 else f"{head(report)}: {units_text(report)}"
    files = collected_text(report)
    line = f"{line}; collected: {files}" if files else line
    return f"{line}; record: {record}" if record else line


def collected_text(report: dict) -> str | None:
    """``3 files, 12.0 KiB in DIR (1 skipped)``: what --collect and --timeline brought back."""
    collected = report.get("collected")
    if not collected:
        return None
    n, where = collected.get("files", 0), collected.get("dir")
    text = f"{n} file{'s' if n != 1 else ''}, {format_size(collected.get('bytes', 0))}"
    text += f" in {where}" if where and n else ""
    skipped = collected.get("skipped") or 0
    return text + (f" ({skipped} skipped)" if skipped else "")


def task_table(tasks: list[dict]) -> list[str]:
    """A PS job's tasks: address, how each ended, how long it ran."""
    if not tasks:
        return []
    width = max(len(t["task"]) for t in tasks)
    out = []
    for t in tasks:
        duration = "-" if t.get("duration_s") is None else f"{t['duration_s']:.1f}s"
        code = "" if t.get("exit_code") is None or t.get("status") != "failed" else f" {t['exit_code']}"
        out.append(f"  {t['task']:<{width}}  {t.get('address') or '-':<21}  {t['status'] + code:<12}  {duration}")
    return out


# ------------------------------------------------------------------ posted by a detached launcher

#: what ``compact`` keeps of a report: what ``lines`` reads, nothing per rank or per worker
COMPACT = (
    "job",
    "mode",
    "backend",
    "exit_code",
    "failure",
    "started_at",
    "ended_at",
    "mpi",
    "image",
    "image_digest",
    "ledger",
    "tasks",
    "schema_version",
    "mpilaunch_version",
)


def compact(report: dict) -> dict:
    """The part of a report the closing summary needs, small enough to post where the submitting
    side reads it (a ConfigMap's ``result.json``, a YARN application's diagnostics): a detached job's
    in-cluster launcher posts it, ``mpilaunch wait`` and ``status`` print ``lines`` of it. The
    workers are counted, the nodes cut to the few the summary names (their count kept), the failure cut to
    its first line; a few hundred bytes whatever the job's size."""
    out = {k: report[k] for k in COMPACT if report.get(k) is not None}
    if out.get("failure"):
        out["failure"] = why(report)[:800]
    plan = report.get("plan") or {}
    listed = plan.get("workers") or ()
    out["plan"] = {
        "ranks": plan.get("ranks"),
        "gpus": plan.get("gpus") or 0,
        "workers": listed if isinstance(listed, int) else len(listed),
    }
    nodes = list(report.get("nodes") or ())
    out["nodes"], out["node_count"] = nodes[:SHOWN_NODES], len(nodes)
    timings = report.get("timings") or {}
    out["timings"] = {k: timings[k] for k in ("total_s", "phases") if k in timings}
    return out


# ------------------------------------------------------------------ two records


def key_numbers(report: dict) -> list[tuple[str, str, float | None]]:
    """(what, shown, number to compare or None) of one record: what two runs are compared by."""
    timings = report.get("timings") or {}
    rows = [
        ("job", str(report.get("job")), None),
        ("started", str(report.get("started_at") or "-"), None),
        ("exit", str(report.get("exit_code")), None),
        ("ranks/tasks", units_text(report), None),
        ("nodes", str(len(report.get("nodes") or [])), None),
        ("mpi", mpi_text(report) or "-", None),
        ("total", seconds(total_seconds(report)), total_seconds(report)),
    ]
    for label, spent in merged(time_spent(timings.get("phases") or {})):
        rows.append((label, seconds(spent), spent))
    return rows


def merged(spent: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Segments of one label added up (``run`` can end at ranks_done and at workload_done)."""
    out: dict[str, float] = {}
    for label, s in spent:
        out[label] = out.get(label, 0.0) + s
    return list(out.items())


def side_by_side(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> list[str]:
    """Two records' key numbers in two columns, and how B's times differ from A's."""
    rows_a = {what: (shown, n) for what, shown, n in key_numbers(a)}
    rows_b = {what: (shown, n) for what, shown, n in key_numbers(b)}
    order = [what for what, _, _ in key_numbers(a)]
    order += [what for what, _, _ in key_numbers(b) if what not in rows_a]
    left = max([len(names[0])] + [len(rows_a.get(w, ("-",))[0]) for w in order])
    label = max(len(w) for w in order)
    out = [f"{'':<{label}}  {names[0]:<{left}}  {names[1]}"]
    for what in order:
        shown_a, n_a = rows_a.get(what, ("-", None))
        shown_b, n_b = rows_b.get(what, ("-", None))
        line = f"{what:<{label}}  {shown_a:<{left}}  {shown_b}"
        if n_a is not None and n_b is not None:
            line += f"  ({n_b - n_a:+.2f}s" + (f", {100 * (n_b - n_a) / n_a:+.0f}%)" if n_a > 0 else ")")
        out.append(line.rstrip())
    return out
