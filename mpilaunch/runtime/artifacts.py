"""--collect and --timeline: files out of the workers, after the ranks end and before the release.

Through the channel the job already has, the one the stacks of a hung job
come through (``hang.collect.captures_of``: the workers' agents, or the
Kubernetes exec API): one exec session per worker lists what the globs match
(``artifact_probe.py``, sent as text), the caps are applied to the whole job at
once (``core/artifacts.py``: one line per skipped file), then each worker sends
its files in bounded pieces, written to ``DEST/WORKER/relative/path``.

It runs on every exit path that had workers (success, a failed rank, --timeout,
--stall-timeout), never raises, and is bounded in time: a worker that does not
answer costs one line. The local backend's workers share this machine's
directory, so their files are taken once, from the first worker.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

from ..core import artifacts as plan
from ..core.errors import UsageError
from ..core.exit_codes import EXIT_INTERRUPTED
from ..core.interpreter import interpreter_word
from .record import KEEP_ENV

PREFIX = "mpilaunch: collect: "
#: listing every worker at once may take this long
LIST_DEADLINE_S = 30.0
#: bytes one exec session brings back at most (it is held in memory), and files it names at most
#: (their paths go into the exec request: the Kubernetes exec API takes them in its URL)
PIECE_BYTES = 32 * plan.MIB
PIECE_FILES = 100
#: a piece's time: a floor, plus what it takes at a slow channel's rate
PIECE_FLOOR_S = 30.0
SLOW_RATE = 4 * plan.MIB
#: workers sending at once
PARALLEL = 4


def probe_text() -> str:
    import pkgutil  # --collect only (pkgutil brings typing: ~3 ms of every launch otherwise)

    return pkgutil.get_data(__package__, "artifact_probe.py").decode()


def probe_command(python: str, mode: str, arg) -> str:
    return (
        f"exec {interpreter_word(python)} -c {shlex.quote(probe_text())} {mode} "
        f"{shlex.quote(json.dumps(arg, separators=(',', ':')))}"
    )


def globs_of(spec) -> tuple[str, ...]:
    """--collect's globs, and --timeline's file."""
    extra = (plan.timeline_glob(spec.timeline),) if spec.timeline else ()
    return tuple(spec.collect) + tuple(g for g in extra if g not in spec.collect)


def collect_for(run, workload) -> dict | None:
    """The lifecycle's step, before the release (``run``: its RunContext): into the ``files``
    folder of --output-dir, else staged in the run directory for the record (``record.keep``). None
    after Ctrl-C: whoever interrupts a job wants it gone, not a wait for its files. Relative globs
    start where each worker's ranks ran, as their start lines said (``RankOutput.rank_cwds``:
    MPI chooses it, mpirun's directory where the worker has it), else where its sessions start."""
    if run.result.exit_code == EXIT_INTERRUPTED or not globs_of(run.spec):
        return None
    dest = (run.output_dir if run.output_dir is not None else run.rundir) / plan.FILES_DIR
    cwds = dict(getattr(getattr(workload, "output", None), "rank_cwds", None) or {})
    return collect(run.spec, run.context_file, dest, run.stderr, bool(run.backend.workers_on_this_host), cwds)


def staged(run) -> Path | None:
    """What ``collect_for`` left for the record to take (no --output-dir), if anything."""
    path = run.rundir / plan.FILES_DIR
    return path if run.output_dir is None and globs_of(run.spec) else None


def check_destination(spec, keep_records: int | None, output_dir) -> None:
    """Before anything is allocated: collected files need a place (--output-dir, or a record)."""
    if globs_of(spec) and keep_records == 0 and not output_dir:
        raise UsageError(
            "--collect and --timeline bring files into --output-dir or the job's record, and "
            f"{KEEP_ENV}=0 keeps no record",
            "add --output-dir DIR",
        )


def collect(spec, context_file: Path, dest: Path, stderr, shared_host: bool, cwds: dict | None = None) -> dict | None:
    """Bring the files back into ``dest``; report.json's ``collected`` (None: nothing was asked,
    or the job never had workers to ask). Never raises: a failure is a line and the job's end stands."""
    globs = globs_of(spec)
    if not globs:
        return None
    try:
        context = json.loads(context_file.read_text())
    except (OSError, ValueError):  # the job ended before its workers were ready: none to ask
        return None
    t0 = time.monotonic()
    summary = {"files": 0, "bytes": 0, "dir": None, "skipped": 0, "globs": list(globs)}
    try:
        captures = captures_of(context, shared_host)
        python = str(context.get("probe_python") or "python3")
        listings = list_all(captures, python, globs, stderr, cwds or {})
        found, skipped = found_files(listings, stderr)
        choice = plan.choose(found, spec.collect_max_bytes, spec.collect_max_file_bytes)
        for line in choice.skipped:
            say(line, stderr)
        unmatched = set(globs) if listings else set()  # no worker answered: each said so already
        for listing in listings.values():
            unmatched &= set(listing.get("unmatched") or ())
        for pattern in sorted(unmatched):
            say(f"nothing matched {pattern!r} on any worker", stderr)
        written = fetch_all(captures, python, choice.taken, dest, stderr)
        summary.update(
            dir=str(dest.absolute()) if written else None,
            files=len(written),
            bytes=sum(f.size for f in written),
            skipped=skipped + len(choice.skipped) + (len(choice.taken) - len(written)),
        )
    except Exception as e:  # an extra: whatever happened, the release goes on
        say(f"stopped: {e}", stderr)
    summary["seconds"] = round(time.monotonic() - t0, 3)
    return summary


def captures_of(context: dict, shared_host: bool) -> dict:
    from ..hang.collect import captures_of as exec_channels

    captures = {w: c for w, c in exec_channels(context).items() if plan.safe_worker(w)}
    if shared_host and captures:  # one directory for all of them: once, under the first name
        first = min(captures, key=worker_order)
        return {first: captures[first]}
    return captures


def worker_order(name: str):
    """worker-2 before worker-10."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def list_all(captures: dict, python: str, globs: tuple[str, ...], stderr, cwds: dict) -> dict[str, dict]:
    """{worker: its listing}, every worker asked at once (``cwds``: worker -> where its ranks ran);
    one line for each that did not answer."""
    deadline = time.monotonic() + LIST_DEADLINE_S
    listings: dict[str, dict] = {}
    lock = threading.Lock()

    def ask(worker, capture):
        try:
            status, out, err = capture(
                probe_command(python, "list", {"globs": list(globs), "cwd": cwds.get(worker)}),
                max(1.0, deadline - time.monotonic()),
            )
            if status != 0:
                tail = err.decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"its listing exited {status}" + (f": {tail[-1][:200]}" if tail else ""))
            listing = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
            with lock:
                listings[worker] = listing
        except Exception as e:  # AgentError, TimeoutError, a bad answer: this worker's files stay
            say(f"no files from {worker}: {e or type(e).__name__}", stderr)

    threads = [threading.Thread(target=ask, args=item, daemon=True) for item in sorted(captures.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 1.0)
    with lock:
        return dict(listings)


def found_files(listings: dict[str, dict], stderr) -> tuple[list[plan.Found], int]:
    """The files the workers listed (named safely), and how many were skipped: one line each."""
    found, skipped = [], 0
    for worker in sorted(listings, key=worker_order):
        listing = listings[worker]
        for item in listing.get("skipped") or ():
            say(f"skipped {worker}:{item.get('path')} ({item.get('why')})", stderr)
            skipped += 1
        for item in listing.get("files") or ():
            name = plan.safe_name(item.get("name"))
            size = item.get("size")
            if name is None or not isinstance(size, int) or size < 0:
                say(f"skipped {worker}:{item.get('path')} (its name or size is not usable here)", stderr)
                skipped += 1
                continue
            found.append(plan.Found(worker, str(item.get("path")), name, size, str(item.get("real") or "")))
    return found, skipped


def pieces(files: tuple[plan.Found, ...]) -> list[list[tuple[plan.Found, int, int]]]:
    """The files in exec sessions of at most PIECE_BYTES and PIECE_FILES: (file, offset, length);
    a file bigger than a piece spans several."""
    out: list[list] = []
    current: list = []
    held = 0
    for f in files:
        offset = 0
        while True:
            if current and (held >= PIECE_BYTES or len(current) >= PIECE_FILES):
                out.append(current)
                current, held = [], 0
            length = min(f.size - offset, PIECE_BYTES - held)
            current.append((f, offset, length))
            held += length
            offset += length
            if offset >= f.size:
                break
    return out + ([current] if current else [])


def fetch_all(captures: dict, python: str, taken: tuple[plan.Found, ...], dest: Path, stderr) -> list[plan.Found]:
    """Each worker's files into ``dest/WORKER/``, a few workers at once; the files written whole."""
    by_worker: dict[str, list[plan.Found]] = {}
    for f in taken:
        by_worker.setdefault(f.worker, []).append(f)
    from concurrent.futures import ThreadPoolExecutor  # here: not on every launch's import path

    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        done = pool.map(
            lambda w: fetch_worker(captures[w], python, tuple(by_worker[w]), dest / w, stderr), sorted(by_worker)
        )
        return [f for files in done for f in files]


def fetch_worker(capture, python: str, files: tuple[plan.Found, ...], dest: Path, stderr) -> list[plan.Found]:
    failed: set[plan.Found] = set()
    for piece in pieces(files):
        piece = [(f, off, n) for f, off, n in piece if f not in failed]
        if not piece:
            continue
        size = sum(n for _, _, n in piece)
        try:
            status, out, err = capture(
                # the resolved path: a link swapped in since the listing is not followed out
                probe_command(python, "send", [[f.source or f.path, off, n] for f, off, n in piece]),
                PIECE_FLOOR_S + size / SLOW_RATE,
            )
            if status != 0:
                tail = err.decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"exited {status}" + (f": {tail[-1][:200]}" if tail else ""))
        except Exception as e:
            for f, _, _ in piece:
                if f not in failed:
                    failed.add(f)
                    say(f"skipped {f.worker}:{f.path} (not received: {e or type(e).__name__})", stderr)
            continue
        failed |= write_piece(piece, out, dest, stderr)
    for f in failed:  # no half files: a file is there whole or not at all
        try:
            (dest / f.name).unlink()
        except OSError:
            pass
    return [f for f in files if f not in failed]


def write_piece(piece, data: bytes, dest: Path, stderr) -> set:
    """The sent bytes at their offsets; the files that failed (one line each)."""
    import struct  # here: not on every launch's import path

    failed, at = set(), 0
    for f, offset, length in piece:
        if at + 9 > len(data):
            failed.add(f)
            say(f"skipped {f.worker}:{f.path} (its answer was cut short)", stderr)
            continue
        status, n = data[at], struct.unpack(">Q", data[at + 1 : at + 9])[0]
        body = data[at + 9 : at + 9 + n]
        at += 9 + n
        if status != 0:
            failed.add(f)
            say(f"skipped {f.worker}:{f.path} ({body.decode(errors='replace')})", stderr)
            continue
        path = dest / f.name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "r+b" if offset else "wb") as out:
                out.seek(offset)
                out.write(body)
        except OSError as e:
            failed.add(f)
            say(f"skipped {f.worker}:{f.path} (cannot write {path}: {e.strerror or e})", stderr)
    return failed


def say(line: str, stderr) -> None:
    try:
        print(PREFIX + line, file=stderr, flush=True)
    except (OSError, ValueError):
        pass
