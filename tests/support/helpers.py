"""Helpers for tests that run the mpilaunch command line for real."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"
LOGIN_USER_LOCK = "/tmp/mpilaunch-nonroot-tests.lock"


@contextlib.contextmanager
def login_user_alone(wait_s: float = 600.0):
    """The unprivileged user (scripts/nonroot-user.sh) to one test at a time, across test sessions.

    The non-root tests count every process of that user, and the ssh testbed's jobs log in as it:
    ./scripts/test runs its Kubernetes part and the rest of the suite as two pytest sessions side
    by side, which would otherwise see each other's jobs. A lock file, held for the test."""
    with open(LOGIN_USER_LOCK, "w") as lock:

        def taken() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        wait_for(taken, wait_s, f"{LOGIN_USER_LOCK}, which another test session holds", interval=0.2)
        yield


def mpilaunch_env(install=None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPILAUNCH_")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    if install is not None and install.pythonpath:
        env["PYTHONPATH"] = install.pythonpath
    env.update(extra)
    return env


def run_mpilaunch(args, install=None, env_extra=None, timeout=240, **popen):
    cmd = [sys.executable, "-m", "mpilaunch"]
    if install is not None:
        cmd += ["--mpirun", install.mpirun]
    cmd += list(args)
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=mpilaunch_env(install, **(env_extra or {})),
        **popen,
    )


def names_job(job_name: str):
    """A predicate: does a command line name this job, not merely another job whose name ends
    with this one? Tests in the suite's parts run side by side: "sigkill-local" must not find
    "k8s-sigkill-local"'s processes (CI failed so). The name is preceded by no word character
    or "-", except in mpilaunch's run directories (``mpilaunch-NAME-xxxx``)."""
    pattern = re.compile(r"(?:(?<![\w-])|(?<=/mpilaunch-))" + re.escape(job_name) + r"(?!\w)")
    return lambda cmdline: pattern.search(cmdline) is not None


def leftover_processes(job_name: str) -> list[str]:
    """Processes of a job still alive: anything whose command line or environment names it."""
    found = []
    me = os.getpid()
    named = names_job(job_name)
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        if p.info["pid"] == me:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        env = p.info["environ"] or {}
        if named(cmd) or env.get("MPILAUNCH_WORKER", "").startswith(job_name + "-"):
            found.append(f"{p.info['pid']}: {cmd[:120]}")
    return found


def agent_workers() -> dict[int, str]:
    """Every local exec agent on this machine: pid -> the worker it serves.

    An agent started as its own interpreter says so on its command line
    (``mpilaunch.agent ... --name WORKER``); one forked from mpilaunch (the
    local backend's default) has mpilaunch's command line, but its name is
    ``mpilaunch.agent`` and its stdout is ``WORKER.agent.log``.
    """
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
            with open(f"/proc/{pid}/comm", "rb") as f:
                comm = f.read().strip()
            if b"mpilaunch.agent" in cmdline and b"--name" in cmdline:
                found[int(pid)] = cmdline[cmdline.index(b"--name") + 1].decode()
            elif comm == b"mpilaunch.agent":
                log = os.readlink(f"/proc/{pid}/fd/1")
                if log.endswith(".agent.log"):
                    found[int(pid)] = os.path.basename(log)[: -len(".agent.log")]
        except (OSError, IndexError):
            continue
    return found


def agent_pid(worker):
    """The pid of the exec agent serving worker ``worker``; fails when there is none."""
    for pid, served in agent_workers().items():
        if served == worker:
            return pid
    raise AssertionError(f"no agent for {worker}")


def wait_started(proc, count: int, text: str = "started", timeout: float = 180, context=None) -> list[str]:
    """Read a running job's stdout until ``count`` lines contain ``text``; the lines read.

    Fails with the job's stderr when it ended first. A job that stays silent would
    block ``readline`` past any deadline checked between lines, so a timer does the
    deadline: it snapshots the job's process tree and ends the job (SIGTERM, which
    releases what it allocated), and the failure shows the tree and the job's stderr,
    and what ``context()`` says then (the cluster's view of the job, say).
    """
    seen, started, stuck = [], 0, []

    def give_up():
        said = process_tree(proc.pid)
        if context is not None:
            try:
                said += f"\n{context()}"
            except Exception as exc:  # a diagnostic must not hide the failure it explains
                said += f"\n(context: {exc!r})"
        stuck.append(said)
        proc.terminate()

    timer = threading.Timer(timeout, give_up)
    timer.start()
    try:
        while started < count:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            started += text in line
    finally:
        timer.cancel()
    if started < count:
        why = f"{count - started} of {count} units did not start"
        if stuck:
            why += f" in {timeout:.0f} s; the job's processes then:\n{stuck[0]}"
        try:
            err = proc.communicate(timeout=60)[1]  # its stdout ended or it was sent SIGTERM: it is ending
        except subprocess.TimeoutExpired:
            err = "(stderr: the job did not end within 60 s)"
        raise AssertionError("".join(seen)[-2000:] + why + "\n" + (err or "")[-3000:])
    return seen


def tree(pid: int) -> list[psutil.Process]:
    """``pid``'s process and all its descendants, itself first; empty once it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def process_tree(pid: int) -> str:
    """One line per process under ``pid`` (itself first): pid, status, command line."""
    procs = tree(pid)
    if not procs:
        return f"(pid {pid} is gone)"
    lines = []
    for p in procs:
        try:
            lines.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            continue
    return "\n".join(lines)


def wait_for(pred, timeout: float, what: str, interval: float = 0.3, detail=None):
    """Poll ``pred`` until it returns something true (returned), or fail naming ``what``
    and, when given, what ``detail()`` says then (the processes still left, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}" + (f":\n{detail()}" if detail else ""))


def assert_intel_allreduce_placed(name: str, stdout: str) -> None:
    """tests/programs/placement.py under Intel MPI: 4 ranks summed to 10, two per worker, on Intel's library."""
    ranks = sorted(
        (json.loads(line[line.find("{") :]) for line in stdout.splitlines() if '"rank"' in line),
        key=lambda r: r["rank"],
    )
    assert [r["sum"] for r in ranks] == [10] * 4
    assert all(r["library"].startswith("Intel(R) MPI Library") for r in ranks), ranks[0]["library"]
    assert [r["worker"] for r in ranks] == [f"{name}-worker-0"] * 2 + [f"{name}-worker-1"] * 2


def assert_local_worker_lost(proc, err: str, job: str, worker: int, agent: int) -> str:
    """The job ended with exit 5 and its first error line names ``<job>-worker-<worker>`` as lost with
    its agent's pid; that line."""
    assert proc.returncode == 5, err[-2000:]  # exit_codes.EXIT_WORKER_LOST
    line = next(line for line in err.splitlines() if line.startswith("mpilaunch: error: "))
    assert line.startswith(
        f"mpilaunch: error: worker {job}-worker-{worker} (agent pid {agent} on localhost) was lost"
    ), err[-2000:]
    return line


def finish(proc: subprocess.Popen, timeout: float, context=None) -> tuple[str, str]:
    """A job's (stdout, stderr) within ``timeout``. Past it, or when the test
    gives up earlier (``stop``), the job gets SIGTERM first: mpilaunch then
    deletes its objects, so a rerun of the test does not find its name taken,
    and what it printed so far is kept for the assertion message.

    ``context``: called past the timeout while the job still holds its workers
    (a YARN application's containers and their logs): the test then fails
    here, with what the job printed and that diagnosis."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        diagnosis = context() if context is not None else None
        if diagnosis is not None:  # where mpilaunch waits, before SIGTERM moves it on
            diagnosis += "\n" + python_stacks([p.pid for p in tree(proc.pid)])
        out, err = stop(proc)
        if diagnosis is None:
            return out, err
        raise AssertionError(
            f"the job did not end within {timeout:g} s\nits stdout (tail):\n{out[-2000:]}\n"
            f"its stderr (tail):\n{err[-2000:]}\n{diagnosis}"
        ) from None


def python_stacks(pids, limit: int = 12) -> str:
    """The thread stacks of each Python process among ``pids``: where a job that stalled waits, in
    mpilaunch, its launcher or an agent. Taken by the product's own probe (``hang.probe.dump_processes``:
    py-spy, the test extra's, on every process at once), as a hung job's ranks are."""
    from mpilaunch.hang import probe

    chosen = [p for p in pids if _is_python(p)][:limit]
    if not chosen:
        return "(no Python process to dump)"
    out = []
    for entry in probe.dump_processes(chosen, budget=30):
        lines = [
            f"---- py-spy dump --pid {entry['pid']} (state {entry['state']})"
            + (f": {entry['note']}" if entry["note"] else "")
        ]
        for thread in entry["threads"]:
            lines.append(f"Thread {thread['id']} ({thread['name'] or 'unnamed'}):")
            lines += [f"    {f['function']} ({f['file']}:{f['line']})" for f in thread["frames"]]
        out.append("\n".join(lines)[:3000])
    return "\n".join(out)


def _is_python(pid: int) -> bool:
    try:
        return "python" in os.path.basename(psutil.Process(pid).exe())
    except (psutil.Error, OSError):
        return False


def run_to_end(cmd, timeout: float, context=None, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run`` with ``finish``'s end: past ``timeout``, SIGTERM and ``context()`` in the failure."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    out, err = finish(proc, timeout, context)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()
