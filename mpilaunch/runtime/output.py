"""Collect mpirun's tagged output: echo it, split it per rank, catch rank start and status lines."""

from __future__ import annotations

import collections
import re
import threading
import time
from pathlib import Path

from ..core import launcher_lines
from ..core.mpi import split_tagged
from ..core.rank_lines import (
    ENV_PREFIX,
    MPI_PREFIX,
    OOM_MARK,
    START_PREFIX,
    STATUS_PREFIX,
    parse_env,
    parse_mpi,
    parse_start_cwd,
    parse_start_line,
    parse_status,
)
from ..core.result import number_ranges

TAIL_LINES = 20
#: a rank log (--output-dir) is at most this late on disk: ``tail -f`` follows
#: it, and a SIGKILLed mpilaunch loses at most this much of it. Flushing every
#: line costs a write(2) per line (benchmarks/bench_output.py --output-dir);
#: a flusher thread that writes what came in since its last round does not.
LOG_FLUSH_S = 0.2
#: mpirun's own first lines are kept too: a daemon's error comes first and
#: Open MPI's generic advice after it would push it out of the tail
HEAD_LINES = 200

# PRRTE (Open MPI 5's mpirun) and ORTE put each rsh-agent child in its own
# process group from both sides of the fork. When the child has already exec'd
# mpilaunch-rsh, the parent's setpgid fails with EACCES and mpirun prints this
# warning, though the child's own setpgid succeeded (PRRTE's source: "Ignore
# this error since the child is off and running"). A race: 17 of 30 launches
# printed it here with both cores busy, 0 of 30 on a quiet machine. It is
# dropped, so it neither alarms the user nor shows among mpirun's last lines
# when a run fails. Any other errno is echoed.
_BENIGN_SETPGID = re.compile(
    r"^\[[^\]]*\] plm:(?:ssh|rsh): Warning: setpgid\(\d+,\d+\) failed in parent with errno=[^(]*\(13\)$"
)


def echo_line(echo: dict, stream: str, line: str) -> None:
    """Show one line on this terminal's ``stream`` (a key of ``echo``).

    A reader that went away (``mpilaunch ... | head``) ends the echo of that
    stream only: the caller goes on draining mpirun's pipe, writing the rank
    logs and reading status lines, so the job runs to its end and its exit
    code still says how it went. (Raising here killed the pump thread: a
    traceback, and the rank logs of --output-dir cut short.)
    """
    target = echo[stream]
    if target is None:
        return
    try:
        target.write(line)
        target.flush()
    except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
        echo[stream] = None


# The rank wrapper's line for a program that could not start (rank.py). A program missing on
# the workers makes every rank say it: 128 ranks, 128 lines. They are held back and shown as one
# line per cause naming the ranks (local jobs are checked before allocating,
# core/program_check.py; on ssh hosts and cluster workers the workers are the first to know). The line
# names its rank itself: Open MPI 5 passed on some of them untagged, after it began to abort
# the job (1 of 4 ranks on kwok pods, 1 of 8 locally).
_CANNOT_START = re.compile(r"^mpilaunch: error: rank (\d+): (cannot start .*)$")


def cannot_start(text: str) -> tuple[int, str] | None:
    """(rank, cause) of a rank wrapper's "cannot start" line; None for any other line."""
    if not text.startswith("mpilaunch: error: rank "):  # most lines: no regex
        return None
    match = _CANNOT_START.match(text)
    return None if match is None else (int(match[1]), match[2])


def unstarted_lines(held: dict[str, set[int]]) -> list[str]:
    """One line for each cause the ranks gave for not starting, naming the ranks."""
    out = []
    for cause, ranks in held.items():
        if len(ranks) == 1:
            (rank,) = ranks
            out.append(f"[{rank}] mpilaunch: error: rank {rank}: {cause}")
        else:
            out.append(f"mpilaunch: error: {len(ranks)} ranks ({number_ranges(ranks)}): {cause}")
    return out


def is_benign_launcher_line(text: str) -> bool:
    """A line of mpirun's own that says nothing is wrong (see _BENIGN_SETPGID)."""
    return _BENIGN_SETPGID.match(text) is not None


class RankOutput:
    """Thread-safe sink for the lines of mpirun's stdout and stderr.

    ``shown_ranks`` (``--output-ranks``): the ranks whose lines reach the
    terminal; None: every rank. The others' lines still go to their logs and
    tails, and mpirun's own lines always show.
    """

    def __init__(self, echo_out, echo_err, output_dir: Path | None = None, shown_ranks=None):
        self.echo = {"stdout": echo_out, "stderr": echo_err}
        self.output_dir = output_dir
        self.shown_ranks = None if shown_ranks is None else frozenset(shown_ranks)
        # the rank wrapper's "cannot start" lines, held back and shown once per cause (unstarted_lines)
        self.unstarted: dict[str, set[int]] = {}  # cause -> the ranks that gave it
        self.tails: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=TAIL_LINES))
        self.launcher_tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.launcher_head: list[str] = []
        self.statuses: list[tuple[int, str, int]] = []  # in arrival order
        self.oom_killed: set[int] = set()  # ranks the kernel's OOM killer ended (their wrapper says so)
        self.starts: list[tuple[int, int | None, int | None, str, str]] = []  # rank wrappers' start lines
        # rank -> [when its start line came, when its status line came] (monotonic; report.json's
        # ranks[].started_at/ended_at: the wrappers' lines carry no clock, mpilaunch's one clock does)
        self.rank_times: dict[int, list] = {}
        # rank -> {"program", "env_digest", "mpi_library", "env_seen"}: the environment check's facts
        self.environments: dict[int, dict] = {}
        self.rank_cwds: dict[str, str] = {}  # worker -> the directory its ranks run in (their start lines)
        # the mpirun workload sets this to a function returning the placement mismatch seen so
        # far (or None); launch loops stop mpirun as soon as it returns one.
        self.placement_check = None
        self.ompi_tag_space = True  # mpi.split_tagged: False under Open MPI 4 (the workload sets it)
        # the launch's token (rank_lines.new_token, set by the workload): only the wrappers' lines that
        # carry it count; None (unit tests) takes any
        self.token: str | None = None
        self.cancelled = False  # set by cancel(): mpilaunch stopped following this run
        # phases seen here (phases.py): first_rank_start, first_output, last_status (monotonic)
        self.times: dict[str, float] = {}
        # when the last line of mpirun's output came (monotonic; the stall watch's silence)
        self.last_line_at = time.monotonic()
        self.launcher_notes: list[str] = []  # an in-cluster launcher's own verdict lines (note())
        self.launcher_error = None  # the MpilaunchError an in-cluster launcher carried over (note())
        self._logs: dict[int, object] = {}
        self._unflushed: set[int] = set()  # ranks whose log has lines not yet written out
        self._flusher: threading.Thread | None = None
        self._closing = threading.Event()
        self._partial: dict[tuple[str, int | None], str] = {}  # a rank's unfinished line
        self._lock = threading.Lock()

    def _log(self, rank: int):
        if self.output_dir is None:
            return None
        if rank not in self._logs:
            try:
                self._logs[rank] = open(self.output_dir / f"rank-{rank}.log", "a", encoding="utf-8")
            except OSError as e:  # the directory was removed meanwhile: no log, the job goes on
                self._logs[rank] = None
                self._log_failed(rank, e)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_logs, name="rank-log-flush", daemon=True)
                self._flusher.start()
        if self._logs[rank] is not None:
            self._unflushed.add(rank)
        return self._logs[rank]

    def _log_failed(self, rank: int, error: OSError) -> None:
        echo_line(
            self.echo,
            "stderr",
            f"mpilaunch: warning: rank {rank}'s log in {self.output_dir} is incomplete: {error.strerror or error}\n",
        )

    def _flush_logs(self) -> None:
        """The flusher thread: every half LOG_FLUSH_S, write out the logs that got lines since the last round."""
        while not self._closing.wait(LOG_FLUSH_S / 2):
            with self._lock:
                self._flush_unflushed()

    def _flush_unflushed(self) -> None:
        for rank in self._unflushed:
            try:
                self._logs[rank].flush()
            except (OSError, ValueError):  # a full disk: the close says so; closed: nothing left
                pass
        self._unflushed.clear()

    def note(self, line: str) -> None:
        """An in-cluster launcher's own line (``launcher_lines.NOTES``): a verdict (``mpilaunch:
        preflight:``, ``... straggler:``) to the user's stderr as it is, as the same line is where
        mpirun runs here; an error it carries is kept for the workload to raise (``launcher_error``)."""
        if line.startswith(launcher_lines.ERROR_PREFIX):
            self.launcher_error = self.launcher_error or launcher_lines.parse_error(line.rstrip("\n"), self.token)
            return
        self.launcher_notes.append(line.rstrip("\n"))
        stream = self.echo["stderr"]
        if stream is not None:
            stream.write(line if line.endswith("\n") else line + "\n")
            stream.flush()

    def next_attempt(self) -> dict:
        """An in-cluster launcher ran mpirun again itself (a spare swapped in for a lost worker): the
        ended attempt's rank lines seen so far (``rank_times``, ``statuses``: its record), forgotten
        here so that the ranks' outcome is the new attempt's alone. Logs and tails go on."""
        with self._lock:
            ended = {"rank_times": self.rank_times, "statuses": self.statuses}
            self.rank_times, self.statuses, self.starts = {}, [], []
            self.oom_killed, self.unstarted = set(), {}
        return ended

    def feed(self, stream: str, line: str) -> None:
        """Take one line of mpirun output (tags and all) and emit every rank line it completes."""
        complete = line.endswith("\n")
        self.last_line_at = time.monotonic()
        segments = split_tagged(line.rstrip("\n"), self.ompi_tag_space)
        with self._lock:
            for i, (rank, fragment) in enumerate(segments):
                key = (stream, rank)
                text = self._partial.pop(key, "") + fragment
                if complete and i == len(segments) - 1:
                    self._emit(stream, rank, text)
                else:
                    self._partial[key] = text

    def _emit(self, stream: str, rank: int | None, text: str) -> None:
        text = text.rstrip("\r")
        token = self.token
        parsed = parse_start_line(text, token)
        if parsed is not None:
            start, program, env_digest = parsed
            now = time.monotonic()
            self.times.setdefault("first_rank_start", now)
            self.rank_times.setdefault(start[0], [now, None])
            self.starts.append(start)
            self.environments.setdefault(start[0], {}).update(program=program, env_digest=env_digest)
            cwd = parse_start_cwd(text, token)
            if cwd:  # where --collect's relative globs start on this rank's worker
                self.rank_cwds.setdefault(start[3], cwd)
            text = text[: text.find(START_PREFIX)].strip(" \0")
            if not text:
                return
        changed = parse_env(text, token)
        if changed is not None:
            self.environments.setdefault(changed[0], {})["env_seen"] = changed[1]
            text = text[: text.find(ENV_PREFIX)].strip(" \0")
            if not text:
                return
        library = parse_mpi(text, token)
        if library is not None:
            self.environments.setdefault(library[0], {})["mpi_library"] = library[1]
            text = text[: text.find(MPI_PREFIX)].strip(" \0")
            if not text:
                return
        status = parse_status(text, token)
        if status is not None:
            now = self.times["last_status"] = time.monotonic()
            self.rank_times.setdefault(status[0], [None, None])[1] = now
            self.statuses.append(status)
            if OOM_MARK in text[text.find(STATUS_PREFIX) :]:
                self.oom_killed.add(status[0])
            text = text[: text.find(STATUS_PREFIX)].strip(" \0")
            if not text:
                return
        if rank is None and is_benign_launcher_line(text):
            return
        unstarted = cannot_start(text)
        if unstarted is not None:  # shown once for all the ranks that say it (unstarted_lines)
            self.unstarted.setdefault(unstarted[1], set()).add(unstarted[0])
            if rank is None:  # a rank's line mpirun passed on untagged: not mpirun's own
                return
        elif rank is None or self.shown_ranks is None or rank in self.shown_ranks:
            echo_line(self.echo, stream, text + "\n" if rank is None else f"[{rank}] {text}\n")
        if rank is None:
            self.launcher_tail.append(text)
            if len(self.launcher_head) < HEAD_LINES:
                self.launcher_head.append(text)
            return
        self.times.setdefault("first_output", time.monotonic())
        self.tails[rank].append(text)
        log = self._log(rank)
        if log is not None:
            try:
                log.write(text + "\n")
            except OSError as e:  # a full disk: the rest of this rank's lines still reach the terminal
                self._logs[rank] = None
                self._unflushed.discard(rank)
                self._log_failed(rank, e)
                try:
                    log.close()
                except OSError:
                    pass

    def misplaced(self):
        """The placement mismatch seen so far, None if none (or verification is off)."""
        return None if self.placement_check is None else self.placement_check()

    def cancel(self) -> None:
        """The run is over for mpilaunch (a worker was lost): loops following a launcher in the cluster stop."""
        self.cancelled = True

    def abandoned(self) -> bool:
        """Stop following the run: it was cancelled, or ranks run elsewhere than planned."""
        return self.cancelled or self.misplaced() is not None

    def pump(self, stream: str, pipe) -> threading.Thread:
        def run():
            for raw in iter(pipe.readline, b""):
                self.feed(stream, raw.decode("utf-8", "replace"))
            pipe.close()

        thread = threading.Thread(target=run, name=f"pump-{stream}", daemon=True)
        thread.start()
        return thread

    def show_unstarted(self) -> None:
        """Show the held-back "cannot start" lines, one per cause (idempotent): called once mpirun
        ended, and at close."""
        with self._lock:
            held, self.unstarted = self.unstarted, {}
        for line in unstarted_lines(held):
            echo_line(self.echo, "stderr", line + "\n")  # where the rank wrapper writes them

    def close(self) -> None:
        self.show_unstarted()
        self._closing.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        with self._lock:
            for (stream, rank), text in list(self._partial.items()):
                if text:
                    self._emit(stream, rank, text)
            self._partial.clear()
            for rank, log in self._logs.items():
                if log is None:
                    continue
                try:
                    log.close()
                except OSError as e:
                    self._log_failed(rank, e)
            self._logs.clear()
            self._unflushed.clear()
