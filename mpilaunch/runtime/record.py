"""The record every job leaves: its report.json, kept in a per-user state directory.

Benchmark teams run the same job again and again and compare runs; like
Slurm's ``sacct``, every job has a record to look at afterwards, without
asking for one. Each job writes its report to
``$XDG_STATE_HOME/mpilaunch/runs/<job>-<UTC start>/report.json`` (default
``~/.local/state``; ``MPILAUNCH_STATE_DIR`` stands for ``.../mpilaunch``),
directories 0700: a report holds the command line and the nodes. The newest
``MPILAUNCH_KEEP_RECORDS`` (default 100) are kept; writing one removes the
oldest beyond that. ``mpilaunch report`` reads them again (``summary.py``).

Standard library only, and no ``datetime``: this runs at the end of every
launch, whose cost is measured (``benchmarks/bench_e2e.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from ..core import env_names
from ..core.errors import UsageError
from ..core.version import __version__

#: report.json's layout; raised when a field changes meaning or goes away (new fields do not)
SCHEMA_VERSION = 1
STATE_DIR_ENV = env_names.STATE_DIR
KEEP_ENV = env_names.KEEP_RECORDS
DEFAULT_KEEP = 100
REPORT = "report.json"
# <job>-<UTC start, to the second>[-<n> when that name was taken]; job names contain '-' too
_RUN_DIR = re.compile(r"^(?P<job>.+)-(?P<at>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?$")


# ------------------------------------------------------------------ where


def state_dir(environ) -> Path:
    """``$MPILAUNCH_STATE_DIR``, else ``$XDG_STATE_HOME/mpilaunch``, else ``~/.local/state/mpilaunch``.

    The XDG base directory spec says a relative ``XDG_STATE_HOME`` is invalid and
    to be ignored: a job run from another directory must find the same records."""
    own = environ.get(STATE_DIR_ENV)
    if own:
        return Path(own).expanduser()
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(environ.get("HOME") or os.path.expanduser("~")) / ".local/state"
    return base / "mpilaunch"


def runs_dir(environ) -> Path:
    return state_dir(environ) / "runs"


def keep_records(environ) -> int:
    """``MPILAUNCH_KEEP_RECORDS``: how many records to keep (0: keep none). Checked before anything
    is allocated: a typo is bad input, not a surprise at the end of a long job."""
    text = environ.get(KEEP_ENV, "").strip()
    if not text:
        return DEFAULT_KEEP
    if not text.isdigit():
        raise UsageError(
            f"{KEEP_ENV} must be a whole number of records, 0 or more; got {text!r}",
            f"e.g. {KEEP_ENV}=100 (the default), or 0 to keep no records",
        )
    return int(text)


def utc_stamp(wall: float) -> str:
    """A run directory's time: ``20261206T233500Z``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))


def iso_utc(wall: float) -> str:
    """ISO 8601 in UTC with milliseconds: ``2026-12-06T23:35:00.123Z``."""
    ms = int(wall * 1000)  # floored, seconds and milliseconds alike
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def new_run_dir(runs: Path, job: str, wall: float) -> Path:
    """A new directory ``<job>-<UTC start>`` under ``runs`` (0700, and its parents made so)."""
    make_private_dirs(runs)
    base = f"{job}-{utc_stamp(wall)}"
    for n in range(0, 1000):
        path = runs / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:  # the same job name started twice in one second
            continue
    raise FileExistsError(f"{runs / base}-*")


def make_private_dirs(path: Path) -> None:
    """``path`` and the parents it lacks, each created 0700 (mkdir's mode does not reach parents)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another job
            pass
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def prune(runs: Path, keep: int) -> list[str]:
    """Remove the oldest run directories beyond the newest ``keep``; the names removed.

    Only directories named as this module names them; another job pruning at
    the same moment is no error (what it removed first is simply gone)."""
    entries = sorted_runs(runs)
    doomed = entries[: max(0, len(entries) - keep)]
    for name in doomed:
        shutil.rmtree(runs / name, ignore_errors=True)
    return doomed


def sorted_runs(runs: Path, job: str | None = None) -> list[str]:
    """The run directories under ``runs``, oldest first (of ``job`` alone where given)."""
    try:
        names = os.listdir(runs)
    except OSError:
        return []
    found = []
    for name in names:
        m = _RUN_DIR.match(name)
        if m is not None and (job is None or m["job"] == job):
            found.append((m["at"], int(m["n"] or 0), name))
    return [name for _, _, name in sorted(found)]


# ------------------------------------------------------------------ what


def wall_clock(mono: float, now_mono: float, now_wall: float) -> float:
    """A ``time.monotonic()`` moment on the wall clock, from one pair of readings taken together."""
    return now_wall - (now_mono - mono)


def nodes_of(workers: dict) -> list[str]:
    """The machines the workers ran on (a pod's node, a container's or agent's host), sorted."""
    return sorted(
        {str(f.get("node") or f.get("host")) for f in workers.values() if f and (f.get("node") or f.get("host"))}
    )


def image_digest(image_id: str | None) -> str | None:
    """``sha256:...`` of a pod's ``imageID`` (``docker.io/x/y@sha256:...``, ``sha256:...``)."""
    if not image_id:
        return None
    digest = image_id.rsplit("@", 1)[-1]
    return digest if digest.startswith("sha") else None


def images_of(workers: dict) -> tuple[str | None, str | None]:
    """(image, digest) the workers ran, where the backend knows (Kubernetes: the pods' status)."""
    images = sorted({f["image"] for f in workers.values() if f and f.get("image")})
    digests = sorted({d for f in workers.values() if f for d in [image_digest(f.get("image_id"))] if d})
    return (", ".join(images) or None), (", ".join(digests) or None)


def common_fields(report: dict, started_wall: float, ended_wall: float) -> dict:
    """What every record carries beside the workload's report (see the module docstring)."""
    image, digest = images_of(report.get("workers") or {})
    out = {
        "schema_version": SCHEMA_VERSION,
        "mpilaunch_version": __version__,
        "started_at": iso_utc(started_wall),
        "ended_at": iso_utc(ended_wall),
        "nodes": nodes_of(report.get("workers") or {}),
    }
    if image:
        out["image"] = image
        out["image_digest"] = digest
    return out


def attempt_record(number: int, t0: float, t_start: float, result, lost, workload=None) -> dict:
    """One entry of report.json's ``attempts``: when it ran (seconds since mpilaunch started), why it
    ended, and each rank's run in it (``ranks``: [rank, started_s, ended_s, exit code], None where its
    wrapper's line never came; the timeline draws an earlier attempt's ranks from these)."""
    output = getattr(workload, "output", None)
    return {
        "attempt": number,
        "started_s": round(t_start - t0, 3),
        "ended_s": round(time.monotonic() - t0, 3),
        "exit_code": result.exit_code,
        "failure": (result.failure or "").split("\n", 1)[0] or None,
        "lost_workers": [w.worker for w in lost],
        "ranks": rank_runs(t0, getattr(output, "rank_times", None), getattr(output, "statuses", None)),
    }


def launcher_attempt_record(number: int, t0: float, t_start: float, ended: dict) -> dict:
    """``attempt_record`` of an attempt an in-cluster launcher ended and ran again itself
    (``ClusterLauncher.relaunched_in_launcher``: a spare swapped in for a lost worker)."""
    ranks = ended.get("ranks") or {}
    return {
        "attempt": number,
        "started_s": round(t_start - t0, 3),
        "ended_s": round(ended["at"] - t0, 3),
        "exit_code": ended.get("exit_code"),
        "failure": ended.get("failure"),
        "lost_workers": [entry["worker"] for entry in ended["swaps"] if entry["why"] == "lost"],
        "ranks": rank_runs(t0, ranks.get("rank_times"), ranks.get("statuses")),
    }


def rank_runs(t0: float, rank_times: dict | None, statuses) -> list:
    """[rank, started_s, ended_s, exit code] of each rank seen (None where its line never came)."""
    codes = {rank: code for rank, _, code in statuses or ()}
    return [
        [rank, *(None if at is None else round(at - t0, 3) for at in span), codes.get(rank)]
        for rank, span in sorted((rank_times or {}).items())
    ]


# ------------------------------------------------------------------ write


def report_text(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"


def write_report(path: Path, report: dict, text: str | None = None) -> None:
    """report.json, whole or not at all: a temporary file beside it, then renamed over it
    (a reader never sees half a report; a failed write leaves no temporary file). ``text``:
    the report as ``report_text`` made it already (a job writing it twice encodes it once)."""
    write_text(path, report_text(report) if text is None else text)


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``, whole or not at all (``write_report``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def keep(
    report: dict, environ, keep_count: int, started_wall: float, text: str | None = None, files: Path | None = None
) -> Path:
    """The job's record in the state directory, and the oldest beyond ``keep_count`` removed:
    the path of its report.json. ``files``: what --collect brought back, staged elsewhere, moved
    in as its ``files`` folder (report.json's ``collected.dir`` then names it). Raises OSError (the caller
    warns: the job's result stands)."""
    runs = runs_dir(environ)
    path = new_run_dir(runs, str(report.get("job") or "job"), started_wall) / REPORT
    try:
        if files is not None and report.get("collected"):
            target = path.parent / files.name
            if files.is_dir() and report["collected"].get("files"):
                shutil.move(str(files), str(target))
                report["collected"]["dir"], text = str(target), None
        write_report(path, report, text)
    except BaseException:
        shutil.rmtree(path.parent, ignore_errors=True)
        raise
    prune(runs, keep_count)
    return path


# ------------------------------------------------------------------ read again


def load(path: Path) -> tuple[dict, Path]:
    """A record from a report.json or a directory holding one, and the report.json's path."""
    file = path / REPORT if path.is_dir() else path
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"no {REPORT} at {path}", "give a job's --name, its record directory or a report.json"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not JSON"
        raise UsageError(f"cannot read {file}: {why}", "give a report.json mpilaunch wrote") from None
    if not isinstance(report, dict) or "exit_code" not in report or "job" not in report:
        raise UsageError(f"{file} is not an mpilaunch report", "give a report.json mpilaunch wrote")
    return report, file


def find(what: str, environ, back: int = 0) -> tuple[dict, Path]:
    """``mpilaunch report`` argument -> its record: a path (a report.json or a directory holding
    one), else the newest record of the job of that name (``back``: that many records before it)."""
    path = Path(what).expanduser()
    if os.sep in what or what.endswith(".json"):
        return load(path)
    runs = runs_dir(environ)
    names = sorted_runs(runs, what)
    if not names and path.exists():  # a record directory named relative to here
        return load(path)
    if len(names) <= back:
        known = sorted({_RUN_DIR.match(n)["job"] for n in sorted_runs(runs)})
        shown = ", ".join(known[-5:]) if known else "none yet"
        have = f"only {len(names)} record of" if names else "no record of"
        raise UsageError(
            f"{have} a job named {what!r} in {runs}",
            f"give a job's --name (recorded: {shown}), a record directory or a report.json",
        )
    return load(runs / names[-1 - back])


def newest(environ) -> tuple[dict, Path]:
    """The newest record of all (``mpilaunch report`` without an argument)."""
    runs = runs_dir(environ)
    names = sorted_runs(runs)
    if not names:
        raise UsageError(f"no job records in {runs} yet", "run a job first, or give a report.json")
    return load(runs / names[-1])  # sorted by start time across jobs: the last started
