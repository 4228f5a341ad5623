"""A slowloris peer: holds as many unauthenticated connections to agents as it can.

    slowloris.py --source 127.0.0.9 --per-target 1024 --ready FILE --stats FILE HOST:PORT|unix:PATH...

For each target it keeps up to ``--per-target`` connections open from
``--source`` (any 127.x address is local on Linux, so the agent sees a
different peer than the launcher on 127.0.0.1; a ``unix:`` target has no
source: a connection refused at once counts as ``refused``), never completes a
handshake, trickles one junk byte a second into each greeted connection
(an agent with TLS greets nobody before the client's TLS hello: a
connection it leaves silent for two polls counts as greeted, and gets the
header of a TLS record that then never completes)
and opens a new connection for every one the agent closes (at most
``--reopen`` per target every 0.1 s).  It writes FILE ``--ready`` once the
first round is in place, and ``--stats`` (JSON per target) every half
second and at exit: connections opened, greeted (a real server hello),
answered busy, dropped by the agent after a hello, and the most it held
greeted at once.  Runs until SIGTERM or ``--seconds``.
"""

import argparse
import errno
import json
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
from mpilaunch.wire import protocol as P

BUSY = getattr(P, "SERVER_BUSY", None)  # None: an agent from before the per-peer limit


class Target:
    def __init__(self, address):
        self.address = address
        # a local backend's agent listens on a Unix socket (unix:PATH) since issue 49
        self.unix = getattr(P, "unix_sockaddr", lambda a: None)(address)
        self.sockaddr = self.unix if self.unix is not None else P.parse_address(address)
        self.conns = {}  # socket -> {"buf": bytes, "greeted": bool}
        self.stats = {"opened": 0, "greeted": 0, "busy": 0, "dropped": 0, "refused": 0, "max_held": 0}

    def open(self, source, n):
        for _ in range(n):
            sock = socket.socket(socket.AF_UNIX) if self.unix is not None else socket.socket()
            sock.setblocking(False)
            try:
                if self.unix is None:
                    sock.bind((source, 0))
                error = sock.connect_ex(self.sockaddr)
            except OSError:
                error = -1
            if error not in (0, errno.EINPROGRESS):  # EACCES: a socket in a directory not ours
                sock.close()
                self.stats["refused"] += 1
                self.stats["last_error"] = errno.errorcode.get(error, str(error))
                return
            self.conns[sock] = {"buf": b"", "greeted": False, "silent": 0, "trickle": b"\x00"}
            self.stats["opened"] += 1

    def poll(self, trickle):
        for sock, state in list(self.conns.items()):
            closed = False
            try:
                while True:
                    data = sock.recv(4096)
                    if not data:
                        closed = True
                        break
                    if state["buf"] is not None:
                        state["buf"] += data
            except BlockingIOError:
                pass
            except OSError:
                closed = True
            if state["buf"] is not None and len(state["buf"]) >= P.SERVER_HELLO_LEN:
                if BUSY is not None and state["buf"][: P.SERVER_HELLO_LEN] == BUSY:
                    self.stats["busy"] += 1
                    closed = True
                else:
                    state["greeted"] = True
                    self.stats["greeted"] += 1
                state["buf"] = None  # the first answer is all that counts
            elif state["buf"] == b"" and not closed and _connected(sock):
                state["silent"] += 1
                if state["silent"] >= 2:  # a TLS agent, waiting for our hello
                    state["greeted"] = True
                    self.stats["greeted"] += 1
                    state["buf"] = None
                    state["trickle"] = b"\x16\x03\x01\x40\x00"  # a 16 KiB handshake record, sent a byte a second
            if not closed and trickle and state["greeted"]:
                try:
                    sock.send(state["trickle"])
                    state["trickle"] = b"\x00"
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
            if closed:
                if state["greeted"]:
                    self.stats["dropped"] += 1
                sock.close()
                del self.conns[sock]
        held = sum(1 for s in self.conns.values() if s["greeted"])
        self.stats["max_held"] = max(self.stats["max_held"], held)
        self.stats["held"] = held


def _connected(sock) -> bool:
    try:
        sock.getpeername()
        return True
    except OSError:
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", default="127.0.0.9")
    parser.add_argument("--per-target", type=int, default=1024)
    parser.add_argument("--reopen", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--stats", required=True)
    parser.add_argument("addresses", nargs="+")
    args = parser.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    targets = [Target(a) for a in args.addresses]
    start = time.monotonic()
    next_trickle = next_stats = start
    ready = False
    while not stop and time.monotonic() - start < args.seconds:
        now = time.monotonic()
        filling = not ready
        for t in targets:
            missing = args.per_target - len(t.conns)
            if missing > 0:
                t.open(args.source, missing if filling else min(missing, args.reopen))
        time.sleep(0.1)
        trickle = now >= next_trickle
        if trickle:
            next_trickle = now + 1.0
        for t in targets:
            t.poll(trickle)
        if not ready:
            ready = True
            time.sleep(0.3)
            for t in targets:
                t.poll(False)
            Path(args.ready).write_text(json.dumps({t.address: t.stats for t in targets}))
        if now >= next_stats:
            next_stats = now + 0.5
            Path(args.stats).write_text(json.dumps({t.address: t.stats for t in targets}))
    Path(args.stats).write_text(json.dumps({t.address: t.stats for t in targets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
