"""What runs in a worker to report its ranks' stacks: ``python3 -c <this file> [--budget S] [--py-spy PATH]``.

Sent as text through the worker's exec agent (``collect``), so it needs
nothing in the worker's image but a python3: standard library only, one
file, no import of mpilaunch. It prints one JSON object on stdout:
``{"worker": ..., "ranks": [{"rank", "size", "pid", "state", "frames", "tool", "note"}],
"tool": ...}``, frames innermost first, the main thread's.

The rank processes are the children of mpilaunch's rank wrappers
(``mpilaunch.rank``): a wrapper is the process whose environment holds the
launch's status token, and the rank it runs is in its MPI variables. Only
this job's wrappers count: those with the probe's own MPILAUNCH_JOB and
MPILAUNCH_WORKER, where the agent gave it those.

How the frames are taken, best first:
- py-spy, in two rounds: ``dump --json`` of every rank (Python frames: ~0.1 s
  of CPU each), then ``--native`` of one rank per distinct Python stack on
  this worker, whose native frames the ranks of the same Python stack get
  too (noted as such). A native dump costs ~0.4 s of CPU (py-spy reads the
  symbols of every library the rank loaded), so one per rank did not fit
  the collection's 15 s at 64 ranks on a small host; ranks waiting on one
  line of the program wait in the same call. ``--nonblocking`` for a
  stopped process, which py-spy cannot suspend (no native frames then);
- the faulthandler that mpilaunch's sitecustomize arms in a Python rank
  (``hang/site``): a real-time signal makes the rank write its Python
  stacks into an unlinked file it holds open, read back here through
  /proc/PID/fd. No tool in the image and no ptrace: what a pod under
  PodSecurity "restricted" (seccomp RuntimeDefault) still allows. The
  signal is sent only where the rank catches it (/proc/PID/status SigCgt)
  and holds that file, so a program that did not arm it never gets it;
- neither: the state only, and the kernel's wait channel as a note.
"""

import json
import linecache
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

TOKEN_ENV = (
    "MPILAUNCH_STATUS_TOKEN"  # env_names.STATUS_TOKEN (no import here: see the docstring): only the wrappers hold it
)
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
# hang/site/sitecustomize.py: the signal it arms and the name of the file it writes to
STACKS_SIGNAL_FROM_MAX = 3  # SIGRTMAX - 3
STACKS_FILE_MARK = "mpilaunch-stacks-"
FAULTHANDLER_SETTLE_S = 0.05  # the dump is done when the file stops growing for this long


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def environ_of(pid):
    raw = read(f"/proc/{pid}/environ", "rb")
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def stat_of(pid):
    """(state letter, ppid) from /proc/PID/stat; None when the process is gone."""
    text = read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces and ")"
    return fields[0], int(fields[1])


def first(env, names):
    return next((env[n] for n in names if env.get(n)), None)


def find_wrappers(own_env):
    """[(wrapper pid, rank, size)] of this job's rank wrappers on this worker."""
    job, worker = own_env.get("MPILAUNCH_JOB"), own_env.get("MPILAUNCH_WORKER")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = environ_of(int(name))
        if not env or TOKEN_ENV not in env:
            continue
        if (job and env.get("MPILAUNCH_JOB") != job) or (worker and env.get("MPILAUNCH_WORKER") != worker):
            continue
        rank = first(env, RANK_VARS)
        if rank is not None and rank.isdigit():
            size = first(env, SIZE_VARS)
            found.append((int(name), int(rank), int(size) if size and size.isdigit() else None))
    return found


def children(pids):
    """{parent pid: [child pids]} for ``pids``."""
    out = {p: [] for p in pids}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat_of(int(name))
            if st is not None and st[1] in out:
                out[st[1]].append(int(name))
    return out


NO_PY_SPY = "none"  # --py-spy none, MPILAUNCH_PY_SPY=none: the fallback only, as where no py-spy is


def find_py_spy(given):
    chosen = given or os.environ.get("MPILAUNCH_PY_SPY")
    if chosen == NO_PY_SPY:
        return None
    candidates = [chosen, shutil.which("py-spy"), os.path.join(os.path.dirname(sys.executable), "py-spy")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def with_source(frames):
    for f in frames:
        if f["kind"] == "python" and f["file"] and f["line"]:
            code = linecache.getline(f["file"], f["line"]).strip()
            if code:
                f["code"] = code
    return frames


def py_spy_frames(spy, pid, state, budget, native=True):
    """(frames, tool, note) of the main thread by py-spy, or (None, None, why) when it could not."""
    threads, tool, why = py_spy_threads(spy, pid, state, budget, native)
    if threads is None:
        return None, None, why
    main = next((t for t in threads if t["id"] == pid), threads[0] if threads else None)
    if main is None:
        return [], tool, "no thread"
    return main["frames"], tool, ""


def py_spy_threads(spy, pid, state, budget, native=True):
    """([{"id", "name", "frames"}] of every thread, tool, "") by py-spy, or (None, None, why)."""
    attempts = [["--nonblocking"]] if state in "Tt" else [["--native"], []] if native else [[]]
    why = None
    for extra in attempts:
        try:
            done = subprocess.run(
                [spy, "dump", "--json", "--pid", str(pid)] + extra,
                capture_output=True,
                text=True,
                timeout=max(0.5, budget),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"py-spy: {type(e).__name__}"
            continue
        if done.returncode != 0:
            why = "py-spy: " + (done.stderr.strip().splitlines() or ["failed"])[0][:200]
            continue
        try:
            threads = json.loads(done.stdout)
        except ValueError:
            why = "py-spy: unreadable output"
            continue
        return (
            [
                {
                    "id": t.get("os_thread_id"),
                    "name": t.get("thread_name") or "",
                    "frames": with_source(
                        [
                            {
                                "function": f.get("name") or "?",
                                "file": f.get("filename") or "",
                                "line": f.get("line") or 0,
                                # a Python frame always has its file; an address py-spy could not
                                # place has neither module nor file (seen under load in CI: it
                                # passed for a Python frame, "in 0x7fffa44b9bf0 at ?:0")
                                "kind": "native" if f.get("module") or not f.get("filename") else "python",
                            }
                            for f in t.get("frames") or ()
                        ]
                    ),
                }
                for t in threads
            ],
            ("py-spy " + " ".join(extra)).strip(),
            "",
        )
    return None, None, why


def dump_processes(pids, budget=30.0, spy=None, native=False):
    """Every thread's frames of each of ``pids`` (any Python processes, not only ranks), all at once:
    [{"pid", "state", "threads", "tool", "note"}]. What the test suite shows of a job that stalled
    (its mpilaunch, agents, launcher), with the same py-spy handling as the ranks' stacks."""
    spy = find_py_spy(spy)
    started = time.monotonic()
    out = [
        {"pid": pid, "state": None, "threads": [], "tool": "", "note": "no answer within the budget"} for pid in pids
    ]

    def one(entry):
        st = stat_of(entry["pid"])
        if st is None:
            entry.update(note="gone")
            return
        entry["state"] = st[0]
        if spy is None:
            entry.update(note="no py-spy")
            return
        threads, tool, why = py_spy_threads(spy, entry["pid"], st[0], budget - (time.monotonic() - started), native)
        entry.update(threads=threads or [], tool=tool or "", note=why or "")

    in_parallel([(one, (entry,)) for entry in out], lambda: budget - (time.monotonic() - started))
    return out


def stacks_signal():
    return signal.SIGRTMAX - STACKS_SIGNAL_FROM_MAX


def catches(pid, signum):
    status = read(f"/proc/{pid}/status") or ""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def stacks_fd(pid):
    """The fd of the unlinked file the rank's faulthandler writes to, or None."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if STACKS_FILE_MARK in target and target.endswith("(deleted)"):
            return fd
    return None


def parse_faulthandler(text):
    """faulthandler's dump -> the frames of its last thread (the main one: listed last), innermost first."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            current = []
            blocks.append(current)
        elif current is not None and line.startswith('  File "'):
            path, _, rest = line[len('  File "') :].partition('", line ')
            number, _, function = rest.partition(" in ")
            current.append(
                {
                    "function": function.strip() or "?",
                    "file": path,
                    "line": int(number) if number.strip().isdigit() else 0,
                    "kind": "python",
                }
            )
    return blocks[-1] if blocks else None


def start_time(pid):
    """When ``pid`` started (/proc/PID/stat field 22): another process that got the pid since has
    another one. None when there is no such process."""
    text = read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


class Target:
    """The one process the probe means to signal, not whichever holds its pid when the signal goes.

    A pidfd (Linux 5.3, Python 3.9) names the process itself: opened while
    the pid's start time is still the one the probe saw, a signal through
    it reaches that process or, once it is gone, nobody. Where pidfds are
    missing the start time is checked again just before ``os.kill``, which
    leaves only that instant's window."""

    def __init__(self, pid, start):
        self.pid, self.start, self.fd = pid, start, None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None and getattr(signal, "pidfd_send_signal", None) is not None:
            try:
                self.fd = opener(pid)
            except OSError:
                self.fd = None  # gone already (ESRCH), or no pidfds here (ENOSYS): the check below decides

    def same(self):
        return self.start is not None and start_time(self.pid) == self.start

    def send(self, signum):
        """True when the signal reached the process the probe saw."""
        if not self.same():  # after the pidfd's opening: it is that process's, or it is gone
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signum)
            else:
                os.kill(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def faulthandler_frames(pid, state, budget, start=None):
    """``start``: the program's start time when the probe found it (``start_time``); the signal goes to
    that process only, never to another that got its pid since."""
    target = Target(pid, start if start is not None else start_time(pid))
    try:
        return _faulthandler_dump(target, state, budget)
    finally:
        target.close()


def _faulthandler_dump(target, state, budget):
    pid, signum = target.pid, stacks_signal()
    if not target.same():
        return None, "exited (its pid is another process's now)"
    fd = stacks_fd(pid)
    if fd is None or not catches(pid, signum):
        return None, "no py-spy on the worker, and the program has no mpilaunch faulthandler armed"
    if state in "Tt":
        return None, "stopped: its faulthandler cannot run (py-spy --nonblocking could read it)"
    try:
        f = open(f"/proc/{pid}/fd/{fd}", "rb")
    except OSError as e:
        return None, f"faulthandler: {e.strerror}"
    with f:
        start = os.fstat(f.fileno()).st_size
        if not target.send(signum):
            return None, "exited before its faulthandler was signalled"
        deadline = time.monotonic() + min(budget, 2.0)
        size, changed = start, time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = os.fstat(f.fileno()).st_size
            if now != size:
                size, changed = now, time.monotonic()
            elif size > start and time.monotonic() - changed >= FAULTHANDLER_SETTLE_S:
                break
        f.seek(start)
        frames = parse_faulthandler(f.read(size - start).decode(errors="replace"))
    if frames is None:
        return None, "faulthandler: no dump within the budget"
    return with_source(frames), ""


def one_rank(pid, rank, size, spy, budget, native=True, program=None):
    """``program``: the wrapper's child where the caller found it already; ``native``: py-spy --native."""
    if program is None:
        program = (children([pid])[pid] or [None])[0]  # the wrapper's child: the user's program
    out = {"rank": rank, "size": size, "wrapper_pid": pid}
    if program is None:
        out.update(state="exited", note="its wrapper has no program left")
        return out
    started = start_time(program)  # read first: the stat below is of this process, or it is gone
    st = stat_of(program)
    if st is None or started is None:
        out.update(state="exited", pid=program)
        return out
    state = st[0]
    out.update(pid=program, state="stopped" if state in "Tt" else "running", proc_state=state)
    frames, tool, note = py_spy_frames(spy, program, state, budget, native) if spy else (None, None, "no py-spy")
    if frames is None:
        fallback, why = faulthandler_frames(program, state, budget, start=started)
        if fallback is not None:
            frames, tool, note = fallback, "faulthandler", ""
        else:
            wchan = (read(f"/proc/{program}/wchan") or "").strip()
            note = "; ".join(
                n for n in (note if spy else "", why, f"kernel wait: {wchan}" if wchan not in ("", "0") else "") if n
            )
    out.update(frames=frames or [], tool=tool or "", note=note or "")
    return out


def in_parallel(calls, left):
    """Run ``(function, args)`` each in a thread; wait for them no longer than ``left()`` seconds."""
    threads = [threading.Thread(target=f, args=args, daemon=True) for f, args in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, left()))


def python_stack_key(frames):
    return tuple((f["function"], f["file"], f["line"]) for f in frames)


def add_native_frames(spy, ranks, left):
    """py-spy --native of one running rank per distinct Python stack; the ranks of the same Python stack
    get its frames (``native_from``: whose they are). Where a native dump fails, the Python frames stay."""
    groups = {}
    for r in ranks:
        if r.get("state") == "running" and r.get("frames") and r.get("tool") == "py-spy":
            groups.setdefault(python_stack_key(r["frames"]), []).append(r)

    found = {}  # key -> (frames, tool): filled by the threads, applied below (a late one is left out)

    def native(key, first):
        frames, tool, _ = py_spy_frames(spy, first["pid"], first.get("proc_state", "S"), left() - 0.2)
        # a native dump taken mid-unwind under load can come back as one unnamed address and no Python
        # frame (seen: "the 2 other ranks are in 0x7fff42335b40 at ?:0", CI at load ~20): kept only
        # where it still shows Python frames, else the group keeps the Python stack it was found by
        if frames is not None and "--native" in (tool or "") and any(f["kind"] == "python" for f in frames):
            found[key] = (frames, tool)

    in_parallel([(native, (key, members[0])) for key, members in groups.items()], left)
    for key, (frames, tool) in list(found.items()):
        first = groups[key][0]
        for r in groups[key]:
            r["frames"], r["tool"] = [dict(f) for f in frames], tool
            if r is not first:
                r["native_from"] = first["rank"]
                r["note"] = f"native frames of rank {first['rank']}, which has the same Python stack"


def main(argv):
    budget, spy = 10.0, None
    while argv:
        option = argv.pop(0)
        if option == "--budget" and argv:
            budget = float(argv.pop(0))
        elif option == "--py-spy" and argv:
            spy = argv.pop(0)
    started = time.monotonic()
    spy = find_py_spy(spy)
    wrappers = find_wrappers(os.environ)
    programs = children([w[0] for w in wrappers])  # one pass over /proc for every rank
    results = [None] * len(wrappers)

    def left():
        return budget - (time.monotonic() - started)

    def work(i, pid, rank, size):
        try:
            results[i] = one_rank(
                pid, rank, size, spy, left() - 0.2, native=False, program=(programs.get(pid) or [None])[0]
            )
        except Exception as e:  # one rank's failure must not cost the others' stacks
            results[i] = {"rank": rank, "size": size, "state": "running", "frames": [], "note": f"probe: {e!r}"}

    in_parallel([(work, (i,) + w) for i, w in enumerate(wrappers)], left)
    ranks = [
        r
        if r is not None
        else {
            "rank": w[1],
            "size": w[2],
            "state": "running",
            "frames": [],
            "note": "no stacks within the probe's budget",
        }
        for r, w in zip(results, wrappers)
    ]
    if spy:
        add_native_frames(spy, ranks, left)
    json.dump(
        {
            "worker": os.environ.get("MPILAUNCH_WORKER"),
            "tool": spy or "faulthandler",
            "ranks": ranks,
            "probe_s": round(time.monotonic() - started, 3),
        },
        sys.stdout,
    )
    sys.stdout.write("\n")
    sys.stdout.flush()
    os._exit(0)  # a py-spy past its timeout must not keep us


if __name__ == "__main__":
    main(sys.argv[1:])
