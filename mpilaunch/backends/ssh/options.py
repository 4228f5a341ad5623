"""The ssh backend's options: how to run ssh, and the hosts' Python. The hosts are the job's --hostfile."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ...core.declared import SUBMITTING, option
from ...core.errors import UsageError
from ..base import BackendOptions

# Ours come after the user's --ssh-option: for each option ssh keeps the first value it is given.
DEFAULT_SSH_OPTIONS = (
    "BatchMode=yes",  # no password or host key prompt: nobody is there to answer it
    # a host that vanishes from the network (power, cable) is noticed in 30 s, not after TCP's minutes
    "ServerAliveInterval=10",
    "ServerAliveCountMax=3",
)


@dataclass(frozen=True)
class SshOptions(BackendOptions):
    backend_class = "mpilaunch.backends.ssh.backend:SshBackend"

    # no detached job on ssh (no launcher of its own there): each option is spent here
    ssh_command: str = option(
        "ssh",
        flag="--ssh-command",
        metavar="CMD",
        detached=SUBMITTING,
        help="the ssh client and its own arguments, split as a shell would "
        "(default: ssh), e.g. 'ssh -F ~/cluster.conf'",
    )
    ssh_options: tuple[str, ...] = option(
        (),
        flag="--ssh-option",
        action="append",
        metavar="KEY=VALUE",
        detached=SUBMITTING,
        help="an ssh_config option for every host, as ssh -o (repeatable); "
        "mpilaunch adds " + ", ".join(DEFAULT_SSH_OPTIONS) + " after them",
    )
    remote_python: str = option(
        "python3",
        flag="--remote-python",
        metavar="PYTHON",
        detached=SUBMITTING,
        help="the hosts' Python (3.8 or newer) that runs mpilaunch's agent and rank wrapper "
        "there (default: python3 on the login PATH; mpilaunch need not be installed there)",
    )

    def __post_init__(self):
        try:
            words = shlex.split(self.ssh_command)
        except ValueError as e:
            raise UsageError(
                f"--ssh-command {self.ssh_command!r} is not a command line: {e}",
                "quote it as a shell would, e.g. --ssh-command 'ssh -F ~/cluster.conf'",
            ) from None
        if not words:
            raise UsageError(
                "--ssh-command is empty", "leave it out (ssh) or give one, e.g. --ssh-command 'ssh -F FILE'"
            )
        for given in self.ssh_options:
            key = given.replace("=", " ").split(" ", 1)[0]
            if not key.isalnum():
                raise UsageError(
                    f"--ssh-option {given!r} is not an ssh_config option",
                    "give KEY=VALUE as for ssh -o, e.g. --ssh-option ConnectTimeout=10",
                )
        if not self.remote_python.strip() or "\n" in self.remote_python:
            raise UsageError(
                f"--remote-python {self.remote_python!r} is no program",
                "give the hosts' python3 (3.8 or newer), e.g. --remote-python /usr/bin/python3",
            )

    def _ssh(self) -> list[str]:
        argv = shlex.split(self.ssh_command)
        for ssh_option in (*self.ssh_options, *DEFAULT_SSH_OPTIONS):
            argv += ["-o", ssh_option]
        return argv

    def ssh_argv(self, host: str, remote_command: str) -> list[str]:
        """ssh running ``remote_command`` (one string, run by the host's login shell) on ``host``,
        without a terminal (-T): stdin, stdout and stderr stay plain pipes."""
        return self._ssh() + ["-T", "--", host, remote_command]

    def resolve(self, host: str) -> str | None:
        """The address ssh would connect to for ``host`` (its config's HostName, resolved); None if
        it cannot tell. Connects nowhere (``ssh -G`` prints the configuration it would use)."""
        import socket
        import subprocess

        try:
            config = subprocess.run(
                self._ssh() + ["-G", "--", host], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL
            ).stdout
            name = next(line.split()[1] for line in config.splitlines() if line.startswith("hostname "))
            return socket.getaddrinfo(name, 22, type=socket.SOCK_STREAM)[0][4][0]
        except (OSError, subprocess.SubprocessError, StopIteration, IndexError):
            return None
