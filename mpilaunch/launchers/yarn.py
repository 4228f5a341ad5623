"""The launcher container of a YARN job: ``python -m mpilaunch.launchers.yarn``.

With ``--launcher cluster`` (what ``auto`` means for yarn) the application
has one container of the skein service ``launcher``, requested with the
workers. This module runs in it and

1. waits for and reads the launch description (put once every worker's
   agent answers) (``<kv>launcher/spec``: workers with their
   agent addresses, the rank command, resolved ``-x`` values, mpirun, ...)
   and the job secret (``<kv>launcher/secret``, deleted once read) from
   skein's key-value store: the secret is written to a 0600 file in a
   private directory and is on no command line, in no environment and in no
   ``launch_container.sh``;
2. writes the hostfile, the shim's context file and the shim launcher for
   its own paths, publishes ``<kv>launcher/info`` (its ``CONTAINER_ID``,
   host, mpirun) and runs mpirun with ``mpilaunch-rsh`` and the agents, as
   the local launcher would;
3. streams mpirun's stdout/stderr lines into the key-value store in chunks
   (``<kv>launcher/out/<seq>``, JSON ``[[stream, line], ...]``) that the
   submitting side feeds to its rank-output parser and deletes, stops mpirun
   when ``<kv>launcher/stop`` appears (fail fast after a rank failed), and
   finally puts mpirun's exit code in ``<kv>launcher/exit``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..backends.yarn_keys import EXIT_KEY, INFO_KEY, OUT_KEY, SECRET_KEY, SPEC_KEY, STOP_KEY

FLUSH_S = 0.1
CHUNK_BYTES = 256 * 1024


class Streamer:
    """Lines of mpirun's pipes -> numbered chunks in the key-value store."""

    def __init__(self, kv, prefix: str):
        self.kv = kv
        self.prefix = prefix
        self.pending: list[list[str]] = []
        self.size = 0
        self.seq = 0
        self.lock = threading.Lock()
        self.put_lock = threading.Lock()
        self.done = threading.Event()
        self.flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self.flusher.start()

    def add(self, stream: str, line: str) -> None:
        with self.lock:
            self.pending.append([stream, line])
            self.size += len(line)
            big = self.size >= CHUNK_BYTES
        if big:
            self.flush()

    def flush(self) -> None:
        with self.put_lock:
            with self.lock:
                batch, self.pending, self.size = self.pending, [], 0
            if not batch:
                return
            key = f"{self.prefix}{OUT_KEY}{self.seq:010d}"
            self.seq += 1
            self.kv[key] = json.dumps(batch).encode()

    def _flush_loop(self) -> None:
        while not self.done.wait(FLUSH_S):
            try:
                self.flush()
            except Exception:
                pass

    def pump(self, stream: str, pipe) -> threading.Thread:
        def run():
            for raw in iter(pipe.readline, b""):
                self.add(stream, raw.decode("utf-8", "replace"))
            pipe.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.done.set()
        self.flush()


def run(app, prefix: str) -> int:
    from .. import hostfile, mpi
    from ..workloads.mpirun import rank_command
    from ..workloads.base import shim_path
    from ..procs import forward_signals_to_group
    from ..spec import JobSpec

    launch = json.loads(app.kv.wait(prefix + SPEC_KEY).decode())
    secret = app.kv.wait(prefix + SECRET_KEY)
    app.kv.discard(prefix + SECRET_KEY)
    streamer = Streamer(app.kv, prefix)
    rundir = Path(tempfile.mkdtemp(prefix=f"mpilaunch-{launch['job']}-launcher-"))
    os.chmod(rundir, 0o700)
    proc = None
    try:
        secret_file = rundir / "secret"
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret.rstrip(b"\n") + b"\n")
        del secret
        # What the submitting machine's mpirun would have had (its PATH etc.,
        # forwarded by the shim to the daemons); none with --env-archive.
        os.environ.update(launch.get("environ") or {})
        try:
            info = mpi.find_mpirun(launch.get("mpi", "auto"), launch.get("mpirun"), os.environ.get("PATH"))
        except Exception as e:
            streamer.add("stderr", f"mpilaunch: launcher: no usable mpirun in the launcher container: {e}\n")
            return 2
        workers = [(name, int(slots)) for name, slots, _ in launch["workers"]]
        (rundir / "hostfile").write_text(hostfile.render(workers, info.hostfile_flavour))
        context = {
            "job": launch["job"],
            "transport": "agent",
            "secret_file": str(secret_file),
            "forward_env": list(launch.get("forward_env") or ()),
            "cwd": None,
            "workers": {name: {"address": address} for name, _, address in launch["workers"]},
        }
        (rundir / "context.json").write_text(json.dumps(context))
        spec = JobSpec(command=tuple(launch["command"]), bind_gpus=bool(launch.get("bind_gpus")))
        command = mpi.build_mpirun(
            info, ranks=sum(s for _, s in workers), hosts=len(workers), hostfile=str(rundir / "hostfile"),
            shim=shim_path(rundir), command=rank_command(spec, list(launch["rank_prefix"])),
            environ=dict(os.environ), user_env=tuple(launch.get("user_env") or ()),
            extra_args=tuple(launch.get("mpi_args") or ()), as_root=os.geteuid() == 0,
        )
        command.env["MPILAUNCH_CONTEXT"] = str(rundir / "context.json")
        cwd = launch.get("cwd")
        cwd = cwd if cwd and os.path.isdir(cwd) else None
        proc = subprocess.Popen(command.argv, env={**os.environ, **command.env}, stdin=subprocess.DEVNULL, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        app.kv[prefix + INFO_KEY] = json.dumps({
            "container": os.environ.get("CONTAINER_ID"),
            "host": os.environ.get("NM_HOST"),
            "mpirun": info.path,
            "flavour": info.flavour,
            "version": info.version,
            "pid": proc.pid,
        }).encode()

        forward_signals_to_group(proc.pid)

        def watch_stop():
            try:
                app.kv.wait(prefix + STOP_KEY)
            except Exception:
                return
            from ..procs import terminate_group

            terminate_group(proc.pid)

        threading.Thread(target=watch_stop, daemon=True).start()
        pumps = [streamer.pump("stdout", proc.stdout), streamer.pump("stderr", proc.stderr)]
        code = proc.wait()
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # nothing left to forward to
            signal.signal(s, signal.SIG_DFL)
        for p in pumps:
            p.join(timeout=10)
        return 128 - code if code < 0 else code
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        try:
            streamer.close()
        except Exception:
            pass
        shutil.rmtree(rundir, ignore_errors=True)


def main() -> int:
    import skein

    prefix = os.environ.get("MPILAUNCH_YARN_KV", "mpilaunch/")
    app = skein.ApplicationClient.from_current()
    try:
        code = run(app, prefix)
    except Exception as e:
        print(f"mpilaunch-yarn-launcher: error: {e!r}", file=sys.stderr, flush=True)
        try:
            app.kv[prefix + OUT_KEY + "9999999999"] = json.dumps(
                [["stderr", f"mpilaunch: launcher container failed: {e!r}\n"]]).encode()
        except Exception:
            pass
        code = 1
    app.kv[prefix + EXIT_KEY] = str(code).encode()
    return code


if __name__ == "__main__":
    try:
        code = main()
    except Exception as e:
        print(f"mpilaunch-yarn-launcher: error: {e!r}", file=sys.stderr, flush=True)
        code = 1
    sys.stderr.flush()
    os._exit(code)
