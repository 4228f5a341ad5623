"""``mpilaunch agent`` command line: read the secret, listen, give the
worker private temp/shm directories, and serve until told to stop."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from mpilaunch.runtime.rundir import write_owner
from mpilaunch.wire import protocol as P
from mpilaunch.wire import tls

from ..core import env_names
from ..core.exit_codes import EXIT_USAGE
from .constants import HANDSHAKE_TIMEOUT, KILL_GRACE
from .core import Agent


def _parse_env_pair(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mpilaunch agent",
        description="Exec agent for mpilaunch-rsh: runs authenticated commands inside this worker.",
    )
    parser.add_argument("--name", required=True, help=f"worker name (exported as {env_names.WORKER})")
    parser.add_argument(
        "--listen",
        default="0.0.0.0:0",
        help="HOST:PORT to listen on (port 0 picks one), or unix:PATH: a Unix socket only this user may use",
    )
    parser.add_argument(
        "--listen-fd",
        type=int,
        metavar="FD",
        help="serve on this inherited listening socket instead of --listen (the local backend "
        "binds it, so mpirun can start before the agent is up)",
    )
    parser.add_argument("--address-file", help="write the reachable HOST:PORT here once listening")
    parser.add_argument("--advertise", help="host name/address to write to the address file")
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument("--secret-file", help="job secret file (must not be group/world readable)")
    secret.add_argument("--secret-stdin", action="store_true", help="read the job secret as one line from stdin")
    parser.add_argument(
        "--own-host",
        action="store_true",
        help="this worker is alone on its host (a Kubernetes pod): no private temp and shared-memory "
        "directories, no shared-host MPI defaults, and the secret may be a Secret volume's "
        "world-readable file (the pod is the job's alone)",
    )
    parser.add_argument(
        "--hostname",
        metavar="NAME",
        help="run in UTS and mount namespaces of its own, with the host name NAME, which resolves there "
        "(a worker that shares its machine with other workers: Open MPI 5 tells nodes apart by their "
        "daemons' host names)",
    )
    parser.add_argument("--exit-with-pid", type=int, help="stop (killing all sessions) when this process is gone")
    parser.add_argument(
        "--orphan-cleanup",
        metavar="DIR",
        help="with --exit-with-pid: remove DIR (the job's run directory, its secret included) when "
        "that process is gone, since it ran no cleanup of its own (SIGKILL)",
    )
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop (killing all sessions) when stdin reaches its end: an agent started over ssh "
        "ends with its ssh session, whatever ended that",
    )
    parser.add_argument(
        "--env",
        action="append",
        type=_parse_env_pair,
        default=[],
        metavar="K=V",
        help="extra environment for every command (repeatable)",
    )
    parser.add_argument("--handshake-timeout", type=float, default=HANDSHAKE_TIMEOUT, help=argparse.SUPPRESS)
    parser.add_argument("--kill-grace", type=float, default=KILL_GRACE, help=argparse.SUPPRESS)
    return parser


def _load_secret(args) -> bytes:
    """The job's credential line (``wire/tls.py``): its MAC secret, and its certificate and key if it has them."""
    if args.secret_stdin:
        line = sys.stdin.buffer.readline()
        secret = line.strip()
        if not secret:
            raise ValueError("no secret on stdin")
        return secret
    from mpilaunch.rsh_agent.agent_client import read_secret

    return read_secret(args.secret_file, shared_ok=args.own_host)


def _credential(line: bytes):
    """``(MAC secret, TLS server context or None)``; ValueError for a credential that cannot serve."""
    credential = tls.parse_credential(line)
    if not credential.tls:
        return credential.mac_key, None
    from mpilaunch.wire import tls_session

    try:
        return credential.mac_key, tls_session.server_context(credential.cert, credential.key)
    except (tls.TlsError, OSError) as exc:
        raise ValueError(f"its certificate or key does not load: {exc}") from None


def _listen(spec: str) -> socket.socket:
    unix = P.unix_sockaddr(spec)
    if unix is not None:
        return listen_unix(unix)
    host, port = P.parse_address(spec if ":" in spec else f"{spec}:0")
    infos = socket.getaddrinfo(host or None, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, stype, proto, _, addr = infos[0]
    sock = socket.socket(family, stype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(1024)
    return sock


def listen_unix(sockaddr: str, backlog: int = 1024) -> socket.socket:
    """A Unix socket listening at ``sockaddr`` (``protocol.unix_sockaddr``), its file its owner's alone.

    What a stale file of an earlier agent left (a replaced worker's) is removed first."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not sockaddr.startswith("\0"):
            try:
                os.unlink(sockaddr)
            except FileNotFoundError:
                pass
        sock.bind(sockaddr)
        if not sockaddr.startswith("\0"):
            os.chmod(sockaddr, 0o600)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _advertised_address(sock, listen_host: str, advertise: str | None) -> str:
    if sock.family == socket.AF_UNIX:
        return P.unix_address(sock.getsockname())
    port = sock.getsockname()[1]
    host = advertise or listen_host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _raise_fd_limit():
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    except (ImportError, ValueError, OSError):
        pass


# MPI names shared-memory segments and session directories after the host
# name and local rank, under TMPDIR and /dev/shm. Two workers on one machine
# (local backend, two YARN containers on one NodeManager) would map each
# other's segments and crash (seen: Open MPI 4 vader segfaults), so every
# worker gets a private directory for both, as a separate machine would have.
PRIVATE_DIR_VARS = (
    "TMPDIR",
    "OMPI_MCA_btl_vader_backing_directory",
    "OMPI_MCA_btl_sm_backing_directory",
    "OMPI_MCA_shmem_mmap_backing_file_base_dir",
)


# Open MPI 5's hierarchical collectives (coll/han) build node-level
# communicators from host locality; when several workers share one machine
# (and host name) that topology is wrong and large allreduces segfault in the
# TCP BTL (seen with two local workers; the plain /bin/sh-agent floor crashes
# the same way). Other collective components are unaffected.
SHARED_HOST_DEFAULTS = {"OMPI_MCA_coll": "^han"}


def private_dir_env(directory: str, given: dict) -> dict:
    """Defaults for PRIVATE_DIR_VARS and SHARED_HOST_DEFAULTS; values passed with --env win."""
    env = {name: given.get(name, directory) for name in PRIVATE_DIR_VARS}
    env.update({name: given.get(name, value) for name, value in SHARED_HOST_DEFAULTS.items()})
    return env


def main(argv=None) -> int:
    """Run the agent until SIGTERM/SIGINT or --exit-with-pid; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.hostname:
        # first: a user namespace (the way for a user who is not root) needs a single thread
        from .hostname import take_hostname

        try:
            take_hostname(args.hostname)
        except OSError as exc:
            print(f"mpilaunch: error: agent cannot take the host name {args.hostname}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        secret, tls_context = _credential(_load_secret(args))
    except (OSError, ValueError) as exc:
        print(f"mpilaunch: error: agent cannot read the job secret: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _raise_fd_limit()
    try:
        listener = socket.socket(fileno=args.listen_fd) if args.listen_fd is not None else _listen(args.listen)
    except (OSError, ValueError) as exc:
        where = f"inherited socket {args.listen_fd}" if args.listen_fd is not None else args.listen
        print(f"mpilaunch: error: agent cannot listen on {where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import shutil
    import tempfile

    extra_env = dict(args.env)
    private = None
    if not args.own_host:
        private = tempfile.mkdtemp(prefix=f"mpilaunch-{os.path.basename(args.name)}-")
        # named as this agent's, so that the next mpilaunch removes it should this agent be SIGKILLed
        write_owner(Path(private))
        extra_env.update(private_dir_env(private, extra_env))
    agent = Agent(
        args.name,
        secret,
        listener,
        extra_env=extra_env,
        exit_with_pid=args.exit_with_pid,
        handshake_timeout=args.handshake_timeout,
        kill_grace=args.kill_grace,
        exit_on_stdin_eof=args.exit_on_stdin_eof,
        tls_context=tls_context,
    )
    listen_host = args.listen
    if P.unix_sockaddr(args.listen) is None and ":" in args.listen:
        listen_host = P.parse_address(args.listen)[0]
    address = _advertised_address(listener, listen_host, args.advertise)
    if args.address_file:
        _write_atomically(args.address_file, address)
    agent.log(f"listening on {address} (pid {os.getpid()})")
    try:
        return agent.serve()
    finally:
        if private:
            shutil.rmtree(private, ignore_errors=True)
        if args.orphan_cleanup and agent.orphaned:
            shutil.rmtree(args.orphan_cleanup, ignore_errors=True)
