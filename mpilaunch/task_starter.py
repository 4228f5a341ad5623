"""Task starter: runs inside each PS-mode container (stdlib only).

    python -m mpilaunch.task_starter --task worker:1 [--host H] [--hold S] -- COMMAND...

The YARN-DTF "Task Starter", with the launcher as registry:

1. Reserve a port: a TCP socket with SO_REUSEADDR and SO_REUSEPORT bound to
   ``0.0.0.0:0`` and *not* listening.  While it is open the kernel hands the
   port to no one else's ``bind(port 0)`` or ``connect()``, but the task can
   bind it itself: gRPC (``tf.distribute.Server``) sets SO_REUSEPORT, most
   Python servers SO_REUSEADDR, and a socket that does not listen never
   receives connections.  So there is no window in which another process can
   take the port (the race tf-yarn describes).
2. Report it: one line ``MPILAUNCH-TASK-ADDRESS host:port`` on stdout.
3. Wait for one JSON line on stdin: ``{"env": {...}, "script": {...}}`` with
   the task's environment built from the complete ClusterSpec.
4. Start the task (its own process group; a single-word COMMAND is a shell
   command line, as in YARN-DTF's ``task_command``), its stdout/stderr are
   ours.  Close the reserved socket once the task listens on the port (seen
   in ``/proc/net/tcp*``), or ``--hold`` seconds after it started.
5. Exit with the task's status (128+N for signal N).  EOF on stdin, or
   SIGTERM/SIGINT/SIGHUP, stops the task: SIGTERM to its process group,
   SIGKILL after a grace period.  The launcher closes stdin to stop a task,
   so a launcher that dies stops its tasks too.
"""

import base64
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .core import env_names
from .core.exit_codes import EXIT_NO_SPEC

ADDRESS_PREFIX = "MPILAUNCH-TASK-ADDRESS "
DEFAULT_HOLD = 120.0  # tasks that never listen (a coordinator) release the port after this
STOP_GRACE = 5.0
POLL = 0.2


def reserve_port(host: str = "0.0.0.0") -> socket.socket:
    """A bound, non-listening socket that keeps its ephemeral port for us (see module doc)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


def listening_ports() -> set:
    """Local ports in LISTEN state, IPv4 and IPv6, from /proc/net/tcp*."""
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":
                        ports.add(int(fields[1].rpartition(":")[2], 16))
        except OSError:
            continue
    return ports


def default_host() -> str:
    """An address other containers can reach us at: our host name's, else the default route's."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
        for info in infos:
            ip = info[4][0]
            if not ip.startswith("127."):
                return ip
    except OSError:
        pass
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            return probe.getsockname()[0]
        finally:
            probe.close()
    except OSError:
        return "127.0.0.1"


def read_line(fd: int, should_stop=lambda: False, limit: int = 64 << 20):
    """One line from ``fd``; None on EOF before a newline or once ``should_stop()``."""
    data = b""
    while b"\n" not in data:
        if should_stop():
            return None
        ready, _, _ = select.select([fd], [], [], POLL)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > limit:
            raise ValueError("cluster spec line too long")
    return data.split(b"\n", 1)[0]


_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_task_variables(word: str, provided: dict) -> str:
    """Replace ``$NAME``/``${NAME}`` of the variables mpilaunch provides (others stay as written).

    The submitting shell cannot expand them (they do not exist there), so
    ``-- python '${DTF_TASK_SCRIPT}' --job_name '$DTF_TASK_JOB_NAME'`` works
    without a shell on the task side.
    """

    def sub(m):
        name = m.group(1) or m.group(2)
        return provided.get(name, m.group(0))

    return _VAR_RE.sub(sub, word)


def task_argv(command: list, provided: dict) -> list:
    """One word: a shell command line (YARN-DTF's task_command); several: argv, task variables expanded."""
    if len(command) == 1:
        return ["/bin/sh", "-c", command[0]]
    return [expand_task_variables(w, provided) for w in command]


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


class Starter:
    def __init__(self, task: str, command: list, host: str, hold: float, stop_grace: float):
        self.task = task
        self.command = command
        self.host = host
        self.hold = hold
        self.stop_grace = stop_grace
        self.sock = None
        self.proc = None
        self.workdir = None
        self.stop_reason = None

    def log(self, msg: str) -> None:
        sys.stderr.write(f"mpilaunch-task-starter[{self.task}]: {msg}\n")
        sys.stderr.flush()

    def _on_signal(self, signum, _frame):
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        try:
            return self._run()
        finally:
            if self.sock is not None:
                self.sock.close()
            if self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _run(self) -> int:
        self.sock = reserve_port()
        port = self.sock.getsockname()[1]
        address = f"{self.host}:{port}"
        os.write(1, f"{ADDRESS_PREFIX}{address}\n".encode())

        line = read_line(0, lambda: self.stop_reason is not None)
        if line is None:
            self.log("the launcher went away before it sent the cluster spec")
            return EXIT_NO_SPEC
        message = json.loads(line)
        provided = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
        provided[env_names.TASK_PORT] = str(port)
        provided[env_names.TASK_ADDRESS] = address
        script = message.get("script")
        if script:
            self.workdir = tempfile.mkdtemp(prefix="mpilaunch-task-")
            path = os.path.join(self.workdir, os.path.basename(script["name"]) or "script")
            with open(path, "wb") as f:
                f.write(base64.b64decode(script["data"]))
            os.chmod(path, 0o700)
            provided["DTF_TASK_SCRIPT"] = path
        env = {**os.environ, **provided}
        argv = task_argv(self.command, provided)
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self.log(f"cannot start {argv[0]}: {e.strerror}")
            return 127 if isinstance(e, FileNotFoundError) else 126
        return self._watch(port)

    def _watch(self, port: int) -> int:
        release_at = time.monotonic() + self.hold
        stdin_open = True
        while True:
            code = self.proc.poll()
            if code is not None:
                return _status(code)
            if self.sock is not None and (time.monotonic() >= release_at or port in listening_ports()):
                self.sock.close()  # the task holds the port now (or never will)
                self.sock = None
            if self.stop_reason:
                return self._stop(self.stop_reason)
            if stdin_open:
                try:
                    ready, _, _ = select.select([0], [], [], POLL)
                except InterruptedError:
                    continue
                if ready:
                    try:
                        data = os.read(0, 65536)
                    except OSError:
                        data = b""
                    if not data:
                        stdin_open = False
                        self.stop_reason = "stdin closed"
            else:
                time.sleep(POLL)

    def _stop(self, reason: str) -> int:
        """End the task's process group: SIGTERM, then SIGKILL after the grace period."""
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            code = self.proc.wait(timeout=self.stop_grace)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(pgid, signal.SIGKILL)  # stragglers of the group, or the task itself
        except ProcessLookupError:
            pass
        if code is None:
            code = self.proc.wait()
        return _status(code)


def parse_args(argv):
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m mpilaunch.task_starter",
        description="Reserve a port, report it, wait for the ClusterSpec, run the task.",
    )
    p.add_argument("--task", required=True, help="TYPE:INDEX of this task (for messages)")
    p.add_argument(
        "--host",
        default=os.environ.get(env_names.TASK_HOST),
        help=f"address to report (default: ${env_names.TASK_HOST}, else this host's address)",
    )
    p.add_argument(
        "--hold",
        type=float,
        default=DEFAULT_HOLD,
        help="keep the port reserved at most this long after the task started, if it never listens",
    )
    p.add_argument("--stop-grace", type=float, default=STOP_GRACE)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no task command given")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    starter = Starter(args.task, args.command, args.host or default_host(), args.hold, args.stop_grace)
    return starter.run()


if __name__ == "__main__":
    sys.exit(main())
