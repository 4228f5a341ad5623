"""What runs first on an ssh host: unpack mpilaunch there, listen, run the exec agent until the session ends.

Not imported here: ``backend.py`` sends this file's text over the ssh
session's stdin to a one-line ``python3 -c`` (``STAGE0``), so nothing of
mpilaunch need be installed on the host, only Python 3.8+ (standard library
only, here and in what it imports from the zip). The session's stdin then
carries, in order:

1. ``SIZE\\n`` and the package zip (``image_tools.zip_bytes``), written to a
   private directory in the host's TMPDIR (mode 0700), which the rank
   wrapper imports from (``ZIP_ENV``);
2. the job secret's line, read by the agent itself (``--secret-stdin``): it
   is never in an argv, on either machine;
3. nothing more until its end, which stops the agent (``--exit-on-stdin-eof``):
   whatever ended the ssh session (mpilaunch's release, mpilaunch killed, the
   connection lost), the agent kills what it started and this removes the
   directory.

stdout carries one line, ``READY`` and JSON (the agent's address and the
host's facts), once the agent's socket listens; nothing after it.
"""

import json
import os
import shutil
import socket
import sys
import tempfile

ZIP_ENV = "MPILAUNCH_SSH_ZIP"
READY = b"mpilaunch-ssh-ready "  # starts the one line for the launcher (a login script may print before it)


def read_zip(stream) -> bytes:
    size = int(stream.readline())
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"the package zip ended after {len(data)} of {size} bytes")
    return data


def listen():
    """A socket on the address this ssh session reached (``SSH_CONNECTION``'s third field): the
    launcher's machine reaches that one. Returns (socket, that address)."""
    conn = os.environ.get("SSH_CONNECTION", "").split()
    host = conn[2] if len(conn) == 4 else ""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(1024)
    return sock, host or socket.gethostname()


def main(name: str) -> int:
    stdin = sys.stdin.buffer
    data = read_zip(stdin)
    tools = tempfile.mkdtemp(prefix="mpilaunch-ssh-")
    try:
        package = os.path.join(tools, "mpilaunch.zip")
        with open(package, "wb") as f:
            f.write(data)
        sys.path.insert(0, package)
        from pathlib import Path

        from mpilaunch.runtime.rundir import sweep_stale_rundirs, write_owner

        write_owner(Path(tools))  # should this process be SIGKILLed, the next job here removes the directory
        sweep_stale_rundirs()  # ... as this one removes those of earlier such jobs (and their agents')
        sock, host = listen()
        address = f"[{host}]:{sock.getsockname()[1]}" if ":" in host else f"{host}:{sock.getsockname()[1]}"
        facts = {
            "address": address,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
        }
        sys.stdout.buffer.write(READY + json.dumps(facts).encode() + b"\n")
        sys.stdout.flush()
        os.dup2(2, 1)  # from here on nothing reaches the launcher's reader of stdout: the agent logs to stderr
        from mpilaunch.agent.cli import main as agent

        # detached: the agent owns the socket from here (closes it once, when it stops)
        return agent(
            [
                "--name",
                name,
                "--listen-fd",
                str(sock.detach()),
                "--advertise",
                host,
                "--secret-stdin",
                "--exit-on-stdin-eof",
                "--env",
                f"{ZIP_ENV}={package}",
            ]
        )
    finally:
        shutil.rmtree(tools, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
