"""What every MPI flavour answers (:class:`MpiFlavour`), and the data passed between them and mpilaunch.

A flavour is a strategy object: how to recognise its mpirun, the argv and
environment of a launch through mpilaunch's agent, its hostfile syntax, what
the rank wrapper needs under it, the hints that name its settings, and what
its mpirun prints about failures. Pure: text and plans in, data out (the one
exception, a flavour's ``resolve_path``, looks at the file system at
detection time, as detection itself does).
"""

from __future__ import annotations

import os
import re
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..rank_env import mask  # one mask for --dry-run, render and the environment check


@dataclass(frozen=True)
class MpiInfo:
    """Which MPI an mpirun is: its flavour, version and path."""

    flavour: str  # a registered flavour's name (registry.FLAVOURS): openmpi | mpich | intel | ...
    version: str
    path: str

    @property
    def major(self) -> int:
        # leading digits only: a version can carry words ("5 (the image's; ...)")
        m = re.match(r"\d+", self.version)
        return int(m.group()) if m else 0

    @property
    def hostfile_flavour(self) -> str:
        """The name ``hostfile.render`` takes: every flavour renders its own syntax."""
        return self.flavour

    @property
    def libdir(self) -> str:
        """``<prefix>/lib`` of the installation mpirun belongs to (``<prefix>/bin/mpiexec.hydra``).

        Intel MPI's ranks need it on LD_LIBRARY_PATH (PyPI's impi-rt puts
        libmpi.so.12 there and nothing adds it to the loader's path).
        """
        return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(self.path))), "lib")


@dataclass(frozen=True)
class MpirunCommand:
    """mpirun's command line and the environment it runs with."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment
    forwarded: dict[str, str] = field(default_factory=dict)  # the user's variables sent to every rank
    masked: frozenset[str] = frozenset()  # names in ``env`` whose values --dry-run does not show

    def shell(self) -> str:
        return shlex.join(self.argv)

    def shown_env(self) -> dict[str, str]:
        """``env`` for --dry-run: the forwarded values masked (``<set, 32 chars>``), shell-quoted otherwise."""
        return {k: mask(v) if k in self.masked else shlex.quote(v) for k, v in self.env.items()}


@dataclass(frozen=True)
class LaunchArgs:
    """What ``build_mpirun`` hands a flavour after deciding, flavour-independently, what the ranks get."""

    ranks: int
    hosts: int  # workers
    hostfile: str
    shim: str  # mpilaunch's rsh agent for this job
    as_root: bool
    names: list[str]  # every variable the ranks get, in order (forwarded ones, then mpilaunch's own)
    values: dict[str, str]  # their values
    on_argv: list[str]  # of ``names``: values that go on mpirun's command line (MPIRUN_OWN_NAMES)
    by_env: list[str]  # of ``names``: the rest, taken from mpirun's own environment (never on argv)


class MpiFlavour(ABC):
    """One MPI implementation's rules. One instance per flavour, registered in ``registry.py``.

    A flavour built on another one (a subclass: Intel MPI on MPICH's hydra)
    inherits its rules and is asked first at detection time.
    """

    name: str  # --mpi's value, MpiInfo.flavour, the registry key
    title: str  # in messages ("Open MPI")
    supported: str = ""  # what "mpilaunch knows ..." says (default: the title)
    executables: tuple[str, ...] = ()  # what --mpi NAME looks for on PATH, in this order
    abi: str = ""  # the library family its ranks must load (envcheck): "openmpi" | "mpich-abi"
    # its remote daemons connect back to mpirun by this host's name, so mpirun must be
    # given an address the workers reach (connect_back_args), and that name must resolve
    proxies_connect_back: bool = False
    # the start of its mpirun's help texts that give no cause ("unable to reliably start"):
    # a daemon's own words are preferred (failures.daemon_error)
    generic_daemon_advice: tuple[str, ...] = ()

    # ------------------------------------------------------------ detection

    @abstractmethod
    def parse_version(self, text: str) -> str | None:
        """The version in ``mpirun --version``'s output when this flavour printed it, else None."""

    def resolve_path(self, path: str) -> str:
        """The executable mpilaunch runs for a detected ``path`` (Intel: the hydra behind its wrapper)."""
        return path

    # ------------------------------------------------------------ the launch

    @abstractmethod
    def hostfile_line(self, host: str, slots: int) -> str:
        """One worker's line of the hostfile this flavour's mpirun reads."""

    def render_hostfile(self, hosts: list[tuple[str, int]]) -> str:
        return "\n".join(self.hostfile_line(host, slots) for host, slots in hosts) + "\n"

    @abstractmethod
    def agent_env(self, shim: str, hostfile: str) -> dict[str, str]:
        """The variables this flavour reads for its agent and hostfile. Every launch sets every
        flavour's (``command.agent_env``): a nested mpirun of another flavour finds them too."""

    @abstractmethod
    def argv(self, info: MpiInfo, launch: LaunchArgs) -> list[str]:
        """mpirun and its options, up to (not including) --mpi-args and the rank command."""

    def env(self, info: MpiInfo, launch: LaunchArgs) -> dict[str, str]:
        """Settings added to mpirun's environment besides the agent's and the forwarded variables."""
        return {}

    def rank_env(self, info: MpiInfo) -> dict[str, str]:
        """mpilaunch's own variables every rank's wrapper gets under this flavour (forwarded like -x)."""
        return {}

    def prepended_dirs(self, info: MpiInfo) -> tuple[str, ...]:
        """Directories its launcher (or the rank wrapper, for it) puts ahead on a rank's path lists
        (LD_LIBRARY_PATH): the environment check takes that rewrite of a forwarded value for no
        mismatch (``envcheck.rewritten_by_launcher``)."""
        return ()

    def needs_own_hostnames(self, info: MpiInfo) -> bool:
        """Whether this MPI tells workers apart only by their host names, so that workers sharing
        one machine must each have a host name of their own (the local backend then gives each
        worker's agent one: ``agent/hostname.py``)."""
        return False

    def rank_wrapper_options(self, info: MpiInfo) -> list[str]:
        """Options for the rank wrapper (``python -m mpilaunch.rank``) under this flavour."""
        return []

    def tune_launch(self, info: MpiInfo, command: MpirunCommand, extra_args, program_words: int) -> None:
        """A job's mpirun after ``build_mpirun`` (its argv ends with ``extra_args`` then the
        ``program_words`` of the rank command): launch-scale settings of this flavour's own, and
        the user's ``--mpi-args`` values in place of mpilaunch's. Nothing by default."""

    def connect_back_args(self, address: str) -> list[str]:
        """Options that make remote daemons reach mpirun at ``address`` (proxies_connect_back)."""
        raise NotImplementedError(f"{self.title}'s daemons do not connect back to mpirun")

    def spawn_argv(self, info: MpiInfo, argv: list[str]) -> list[str]:
        """What is executed to run ``argv`` (Open MPI 5: behind a sweep of a stale session)."""
        return list(argv)

    # ------------------------------------------------------------ mpirun's output

    def tag_has_space(self, major: int) -> bool:
        """Whether its output tag ends with a space of its own (tags.split_tagged)."""
        return True

    def first_failed_rank(self, lines: list[str]) -> tuple[int, int] | None:
        """(rank, exit code) when its mpirun names the first rank that failed, else None."""
        return None

    def daemon_host(self, line: str) -> str | None:
        """The host in a line its daemons print about themselves (``[host:pid] ... error``), else None."""
        return None

    def proxy_error(self, line: str) -> tuple[str, str] | None:
        """(host, message) when ``line`` is a remote proxy's own error line, else None."""
        return None

    # ------------------------------------------------------------ hints and checks

    def launch_hint(self, lines: list[str]) -> str | None:
        """What to do about a launch that failed before any rank did, when its mpirun's
        ``lines`` show a cause this flavour knows, else None."""
        return None

    @abstractmethod
    def agent_setting(self, major: int) -> str:
        """Where this flavour takes its agent from: named in the placement check's hint."""

    def pinned_setting(self, name: str) -> str | None:
        """Why mpilaunch leaves the environment variable ``name`` out of the launch when it would
        choose how this flavour starts its daemons (inherited.py's warning clause), else None."""
        return None

    def __repr__(self) -> str:
        return f"<MPI flavour {self.name}>"
