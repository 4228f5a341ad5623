"""Detect the MPI flavour and build the exact mpirun argv + environment.

Everything here except :func:`detect` and :func:`find_mpirun` is pure: it
takes the plan, paths and the launcher's environment and returns data, so
each flavour's command line is unit-tested without running anything.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

from . import mpi_versions
from .rank_env import FORWARDED_LIST_ENV, WORKER_PATH_ENV
from .errors import UsageError

FORWARDED_PREFIXES = ("NCCL_", "HOROVOD_")
FORWARDED_NAMES = ("PYTHONPATH",)
# The PATH a rank's program is started with (the rank wrapper restores it).
# Open MPI treats an mpirun started by its absolute path like --prefix and
# puts <prefix>/bin ahead of PATH for its daemons and ranks (/usr/bin for a
# distribution's Open MPI: the system python shadows a venv's). The daemons
# keep that (they need it to start); the program gets the PATH its worker
# had before the daemon started: the launcher's for workers that are sent
# its PATH (local, YARN), else the worker's own (captured by the shim's
# remote command, CAPTURE_WORKER_PATH), or the user's -x PATH=...
# (rank_env.WORKER_PATH_ENV). The names of the variables mpilaunch forwards, for the rank's
# digest of them: rank_env.FORWARDED_LIST_ENV. One definition, shared with the rank wrapper.
# Resource-manager components Open MPI (ORTE and PRRTE) may pick up from the
# environment; excluded so the hostfile is the only host list. Excluding a
# component an installation lacks is accepted by both.
RAS_EXCLUDED = "^slurm,gridengine,tm,pbs,lsf,alps,flux"
# The rank wrapper puts this directory first on the program's LD_LIBRARY_PATH
# (prepended there, so the worker's own entries, e.g. CUDA's, stay).
LIBDIR_ENV = "MPILAUNCH_MPI_LIBDIR"
# Forwarded values travel in mpirun's environment, never on its command line
# (``ps`` shows every user's argv on a shared login node: ``-x HF_TOKEN``):
# argv names them (Open MPI's ``-x NAME``, Hydra's ``-genvlist A,B``) and
# mpirun takes each value from its own environment. These few are mpirun's
# own loader and search paths too: a value of the user's that differs from
# mpirun's own stays on the command line rather than changing how mpirun
# itself starts (they are paths, not secrets).
MPIRUN_OWN_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD")
# mpilaunch's own variable that --dry-run masks like the user's values
# (rank.TOKEN_ENV: a program that knew it could forge its rank's status line)
STATUS_TOKEN_ENV = "MPILAUNCH_STATUS_TOKEN"

# Open MPI runs at most plm_rsh_num_concurrent agents at once and keeps one
# per daemon alive: below the host count, a large launch stalls forever.
MIN_NUM_CONCURRENT = 128
# PRRTE's routing tree needs a radix at least this large for wide flat launches
# (field notes: N=96 hangs with the default).
MIN_ROUTED_RADIX = 64
# PRRTE (Open MPI 5's runtime, 3.0.x up to at least 3.0.14 in Open MPI
# 5.0.11) forks ranks on up to 16 launch threads per daemon and stores the
# child's pid only after fork() returns there, while SIGCHLD is reaped on
# the progress thread with waitpid(-1) and matched by that pid. A rank that
# exits before the store (a short command, or the launch thread merely
# descheduled on a busy machine) is reaped, matches nothing and is never
# reported: the daemon waits for it forever and so does mpirun (seen: 16-pod
# `mpirun true` through kwok stalled in half the runs; openpmix/prrte#2713).
# With no launch threads the fork runs on the progress thread itself, which
# cannot reap before the pid is stored.
PRRTE_SPAWN_ON_PROGRESS_THREAD = {"odls_base_max_threads": "0"}


@dataclass(frozen=True)
class MpiInfo:
    flavour: str  # openmpi | mpich | intel
    version: str
    path: str

    @property
    def major(self) -> int:
        # leading digits only: a version can carry words ("5 (the image's; ...)")
        m = re.match(r"\d+", self.version)
        return int(m.group()) if m else 0

    @property
    def hostfile_flavour(self) -> str:
        return "openmpi" if self.flavour == "openmpi" else self.flavour

    @property
    def libdir(self) -> str:
        """``<prefix>/lib`` of the installation mpirun belongs to (``<prefix>/bin/mpiexec.hydra``).

        Intel MPI's ranks need it on LD_LIBRARY_PATH (PyPI's impi-rt puts
        libmpi.so.12 there and nothing adds it to the loader's path).
        """
        return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(self.path))), "lib")


@dataclass(frozen=True)
class MpirunCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment
    forwarded: dict[str, str] = field(default_factory=dict)  # the user's variables sent to every rank
    masked: frozenset[str] = frozenset()  # names in ``env`` whose values --dry-run does not show

    def shell(self) -> str:
        return shlex.join(self.argv)

    def shown_env(self) -> dict[str, str]:
        """``env`` for --dry-run: the forwarded values masked (``<set, 32 chars>``), shell-quoted otherwise."""
        return {k: mask(v) if k in self.masked else shlex.quote(v) for k, v in self.env.items()}


def mask(value: str) -> str:
    """What --dry-run and ``mpilaunch render`` show instead of a forwarded value."""
    return f"<set, {len(value)} chars>"


def parse_version_output(text: str) -> tuple[str, str] | None:
    """``mpirun --version`` output -> (flavour, version), or None if unknown.

    Open MPI 4 and 5 name themselves ("mpirun (Open MPI) 5.0.11", Debian's
    4.1 "mpirun.openmpi (OpenRTE) 4.1.4"); Intel MPI prints its banner
    ("Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build ...",
    2019's "Version 2019 Update 9"); MPICH's hydra (and its derivatives)
    prints "HYDRA build details: Version: 4.0.2". Intel's hydra is checked
    before MPICH's: it descends from it.
    """
    m = re.search(r"\((?:Open MPI|OpenRTE)\)\s+(\d+[\w.]*)", text)
    if m:
        return "openmpi", m.group(1)
    m = re.search(r"Intel\(R\) MPI Library.*?Version\s+(\d+[\w.]*)", text, re.S)
    if m:
        return "intel", m.group(1)
    m = re.search(r"HYDRA build details:.*?Version:\s+(\d+[\w.]*)", text, re.S)
    if m:
        return "mpich", m.group(1)
    return None


def first_line(text: str, limit: int = 80) -> str:
    """What an unrecognised --version printed, for the error message."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return "nothing"
    return repr(line if len(line) <= limit else line[:limit] + "...")


def unknown_mpi_error(path: str, text: str) -> UsageError:
    return UsageError(
        f"cannot tell which MPI {path} is: its --version printed {first_line(text)}",
        "mpilaunch knows Open MPI 4/5, MPICH and Intel MPI: pass --mpi openmpi|mpich|intel to say which one "
        "it is, or point --mpirun at another mpirun",
    )


def _version_text(path: str) -> str:
    # Intel's mpirun is a script that runs "mpiexec.hydra" from PATH: give it its own directory.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(path), env.get("PATH", "")])
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, env=env)
    except OSError as e:
        raise UsageError(f"cannot run {path}: {e.strerror or e}", "check --mpirun or your PATH") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{path} --version did not answer in 30 s", "check the MPI installation") from None
    return proc.stdout + proc.stderr


def hydra_sibling(path: str) -> str:
    """Intel's ``mpirun`` wrapper script -> the ``mpiexec.hydra`` next to it, which mpilaunch runs directly."""
    sibling = os.path.join(os.path.dirname(path), "mpiexec.hydra")
    return sibling if os.path.basename(path) != "mpiexec.hydra" and os.access(sibling, os.X_OK) else path


def detect(path: str, flavour: str = "auto") -> MpiInfo:
    """The MPI behind ``path``; an explicit ``flavour`` is trusted when --version says nothing known."""
    text = mpi_versions.remembered(path)
    if text is None or parse_version_output(text) is None:
        text = _version_text(path)
        if parse_version_output(text) is not None:
            mpi_versions.remember(path, text)
    parsed = parse_version_output(text)
    if parsed is None:
        if flavour != "auto":
            return MpiInfo(flavour=flavour, version="unknown", path=path)
        raise unknown_mpi_error(path, text)
    if parsed[0] == "intel":
        path = hydra_sibling(path)
    return MpiInfo(flavour=parsed[0], version=parsed[1], path=path)


# Names to try for each requested flavour; Debian installs flavour-suffixed links.
_CANDIDATES = {
    "auto": ("mpirun", "mpiexec"),
    "openmpi": ("mpirun.openmpi", "mpirun", "mpiexec"),
    "mpich": ("mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich", "mpiexec", "mpirun"),
    "intel": ("mpiexec.hydra", "mpirun", "mpiexec"),
}


def search_path(path_env: str | None) -> str:
    """PATH, then this Python's scripts directory: ``pip install mpilaunch[mpi]``
    puts Open MPI's mpirun there, which is not always on PATH (pyenv, venvs)."""
    import sysconfig

    path = path_env if path_env is not None else os.environ.get("PATH", "")
    return os.pathsep.join(p for p in (path, sysconfig.get_path("scripts")) if p)


def candidates(names, path_env: str, every_dir: bool) -> list[str]:
    """Executables to try, in PATH order. ``every_dir``: not only the first of each name
    (``--mpi intel`` must find Intel's mpiexec.hydra behind MPICH's on PATH)."""
    if not every_dir:
        return [found for found in (shutil.which(n, path=path_env) for n in names) if found]
    out = []
    for name in names:
        for directory in path_env.split(os.pathsep):
            path = os.path.join(directory, name)
            if directory and os.path.isfile(path) and os.access(path, os.X_OK):
                out.append(path)
    return out


def find_mpirun(flavour: str, explicit: str | None, path_env: str | None = None) -> MpiInfo:
    path_env = search_path(path_env)
    if explicit:
        resolved = shutil.which(explicit, path=path_env) if os.sep not in explicit else explicit
        if not resolved or not os.access(resolved, os.X_OK):
            raise UsageError(f"--mpirun {explicit} not found or not executable", "give the full path to mpirun")
        info = detect(resolved, flavour)
        if flavour != "auto" and info.flavour != flavour:
            raise UsageError(
                f"--mpirun {explicit} is {info.flavour} {info.version}, not {flavour}",
                f"use --mpi {info.flavour} or point --mpirun at a {flavour} mpirun",
            )
        return info
    seen = []
    unknown: list[UsageError] = []
    for resolved in candidates(_CANDIDATES[flavour], path_env, every_dir=flavour != "auto"):
        if os.path.realpath(resolved) in seen:
            continue
        seen.append(os.path.realpath(resolved))
        try:
            info = detect(resolved)
        except UsageError as e:
            unknown.append(e)
            continue
        if flavour in ("auto", info.flavour):
            return info
    if flavour == "auto" and unknown:
        raise unknown[0]  # found one, but cannot tell what it is: say what it printed
    wanted = "an mpirun" if flavour == "auto" else f"a {flavour} mpirun"
    raise UsageError(
        f"no mpirun found ({wanted} on PATH)",
        "install one (pip install 'mpilaunch[mpi]' gives Open MPI 5) or pass --mpirun PATH",
    )


def forwarded_names(environ: dict[str, str], user_env: tuple[str, ...]) -> list[str]:
    """Variables every rank must see: NCCL_*, HOROVOD_*, PYTHONPATH and -x names."""
    names = sorted(
        n for n in environ if n.startswith(FORWARDED_PREFIXES) or n in FORWARDED_NAMES
    )
    for item in user_env:
        name = item.split("=", 1)[0]
        if name not in names:
            names.append(name)
    return names


def resolve_env(names: list[str], user_env: tuple[str, ...], environ: dict[str, str]) -> dict[str, str]:
    """Name -> value for forwarding; -x NAME=VALUE wins, -x NAME takes the launcher's value."""
    explicit = dict(item.split("=", 1) for item in user_env if "=" in item)
    out = {}
    for name in names:
        if name in explicit:
            out[name] = explicit[name]
        elif name in environ:
            out[name] = environ[name]
    return out


def openmpi_agent(shim: str) -> str:
    """Open MPI's rsh/ssh agent value: the shim, else ``false``.

    Open MPI forwards the agent parameter (from its command line *and* its
    environment) to every remote daemon, and a daemon checks it: when the
    value names no program on the daemon's machine, Open MPI 4's orted
    aborts ("plm_rsh_agent was set to a path that could not be found") and
    segfaults (field notes). The per-job shim exists only where mpirun
    runs, never in a pod. The value is a ':'-separated list of alternatives
    and the first one found wins: mpirun finds the shim; a daemon in a pod
    finds ``false`` and never calls it (tree spawn is off), and if something
    ever did call it, the launch fails loudly instead of going astray.
    """
    return f"{shim} : false"


def agent_env(shim: str, hostfile: str) -> dict[str, str]:
    """Agent and hostfile under every name any flavour reads.

    Set for all flavours so that tools run *inside* the job (horovodrun,
    a nested mpirun) find the same agent; Open MPI 5 ignores the OMPI_
    names (field notes), Open MPI 4 ignores the PRTE_ ones.
    """
    return {
        "OMPI_MCA_plm_rsh_agent": openmpi_agent(shim),
        "OMPI_MCA_orte_default_hostfile": hostfile,
        "PRTE_MCA_plm_ssh_agent": openmpi_agent(shim),
        "PRTE_MCA_prte_default_hostfile": hostfile,
        "HYDRA_LAUNCHER": "rsh",
        "HYDRA_LAUNCHER_EXEC": shim,
        "HYDRA_HOST_FILE": hostfile,
        "I_MPI_HYDRA_BOOTSTRAP": "rsh",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC": shim,
        "I_MPI_HYDRA_HOST_FILE": hostfile,
    }


def tag_has_space(info: MpiInfo) -> bool:
    """Whether this mpirun's output tag carries a space of its own (split_tagged)."""
    return not (info.flavour == "openmpi" and 0 < info.major < 5)


def announced_mpi(text: str) -> MpiInfo | None:
    """The MPI an in-cluster launcher names when it starts ("openmpi 4.1.4, 2 workers ready"): its
    mpirun's output is parsed by its rules (an image's Open MPI 4 under a local Open MPI 5)."""
    m = re.match(r"\s*(openmpi|mpich|intel) (\S+?),?(?:\s|$)", text)
    return MpiInfo(flavour=m.group(1), version=m.group(2), path="(launcher)") if m else None


def build_mpirun(
    info: MpiInfo,
    *,
    ranks: int,
    hosts: int,
    hostfile: str,
    shim: str,
    command: list[str],
    environ: dict[str, str],
    user_env: tuple[str, ...] = (),
    extra_args: tuple[str, ...] = (),
    as_root: bool = False,
    rank_env: dict[str, str] | None = None,
) -> MpirunCommand:
    """The exact mpirun argv and added environment for one job.

    ``rank_env``: mpilaunch's own variables for the rank wrapper (forwarded
    like -x values; the digest of forwarded variables leaves them out).
    Every forwarded value goes into ``env`` (mpirun's environment) and argv
    only names it (``MPIRUN_OWN_NAMES`` aside): no value on a command line.
    """
    names = forwarded_names(environ, user_env)
    values = resolve_env(names, user_env, environ)
    own = dict(rank_env or {})
    if "PATH" in values:  # -x PATH=...: the rank's program gets it, not mpirun's prefix ahead of it
        own[WORKER_PATH_ENV] = values["PATH"]
    forwarded = {n: values[n] for n in names if n in values}
    own[FORWARDED_LIST_ENV] = ",".join(forwarded)
    names = names + [n for n in own if n not in names]
    values.update(own)
    if info.flavour == "intel":
        names.append(LIBDIR_ENV)
        values[LIBDIR_ENV] = info.libdir
    names = [n for n in names if n in values]
    on_argv = [n for n in names if n in MPIRUN_OWN_NAMES and values[n] != environ.get(n)]
    by_env = [n for n in names if n not in on_argv]
    # the launch's own settings below win over a forwarded name that collides with one
    env = {n: values[n] for n in by_env}
    env.update(agent_env(shim, hostfile))
    masked = frozenset(n for n in by_env if n in forwarded or n == STATUS_TOKEN_ENV)
    concurrent = str(max(MIN_NUM_CONCURRENT, hosts))
    if info.flavour == "openmpi":
        argv = [info.path]
        if as_root:
            argv.append("--allow-run-as-root")
        argv += ["-np", str(ranks), "--hostfile", hostfile, "--map-by", "slot", "--bind-to", "none"]
        # Open MPI 5 (PRRTE) reads only the ssh/PRTE names, 4 only the rsh/OMPI ones.
        tag, mca, plm, env_prefix = (
            (["--output", "tag"], "--prtemca", "plm_ssh", "PRTE_MCA_") if info.major >= 5
            else (["--tag-output"], "--mca", "plm_rsh", "OMPI_MCA_")
        )
        argv += tag
        # Without tree spawn a daemon daemonizes (setsid, fork, output to
        # /dev/null) and its agent returns at once: a daemon that then dies
        # says nothing and mpirun waits for it forever (seen on real pods).
        # Attached, the daemon lives inside its agent's session: its error
        # reaches mpirun's stderr and its death ends the agent, so mpirun
        # fails. (Open MPI 4 and 5 both take this flag; 5 has no MCA name.)
        argv.append("--leave-session-attached")
        params = {
            # pinned here: the environment (an image's OMPI_MCA_plm=isolated, a
            # Slurm allocation) must not choose the launch (inherited.py)
            "plm": plm.split("_")[1],
            "ras": RAS_EXCLUDED,
            f"{plm}_agent": openmpi_agent(shim),
            f"{plm}_no_tree_spawn": "1",
            f"{plm}_num_concurrent": concurrent,
            "routed_radix": str(max(MIN_ROUTED_RADIX, hosts + 1)),
        }
        if info.major >= 5:
            params.update(PRRTE_SPAWN_ON_PROGRESS_THREAD)
        env.update({env_prefix + k: v for k, v in params.items()})
        for key, value in params.items():
            argv += [mca, key, value]
        # -x NAME (no value): mpirun exports NAME from its own environment (4.1 and 5)
        for name in names:
            argv += ["-x", f"{name}={values[name]}" if name in on_argv else name]
    else:
        # Intel's -f reads host names only and fills each host with as many
        # ranks as the launching machine has cores (seen: --np 2 on two
        # 1-slot workers put both on the first); its -machinefile honours
        # ``host:n``. MPICH's -f honours ``host:n`` itself.
        hostfile_opt = "-machinefile" if info.flavour == "intel" else "-f"
        argv = [info.path, "-n", str(ranks), hostfile_opt, hostfile]
        if info.flavour == "intel":
            argv += ["-bootstrap", "rsh", "-bootstrap-exec", shim]
        else:
            argv += ["-launcher", "rsh", "-launcher-exec", shim]
        # the hostfile, not a Slurm/PBS/LSF/SGE allocation, says where ranks go
        argv += ["-rmk", "user"]
        # Forward only what the job needs: the launcher's own HOSTNAME, PATH
        # etc. must not override the worker's. -genvlist takes the values from
        # mpiexec's environment and, like -genvnone, forwards nothing else
        # (hydra accepts only one of them).
        argv += ["-genvlist", ",".join(by_env)] if by_env else ["-genvnone"]
        argv += ["-prepend-rank"]
        for name in on_argv:
            argv += ["-genv", name, values[name]]
    argv += list(extra_args)
    argv += list(command)
    return MpirunCommand(argv=argv, env=env, forwarded=forwarded, masked=masked)


# ------------------------------------------------------------ daemon errors

_HELP_RULE = re.compile(r"^-{20,}$")
_DAEMON_LINE = re.compile(r"^\[([^\]:\s]+):\d+\] .*(?:FORCE-TERMINATE|Segmentation fault|error|ERROR)")
# Open MPI's generic "could not start daemons" advice names no cause: only
# used when no daemon said anything more specific.
_GENERIC = ("ORTE was unable to reliably start", "PRTE has lost communication", "ORTE has lost communication",
            "An ORTE daemon has unexpectedly failed", "PRTE was unable to reliably start")


def _help_blocks(lines: list[str]) -> list[list[str]]:
    blocks, current = [], None
    for line in lines:
        if _HELP_RULE.match(line.strip()):
            if current is not None:
                blocks.append(current)
                current = None
            else:
                current = []
        elif current is not None:
            current.append(line)
    return blocks


def _first_paragraphs(block: list[str]) -> str:
    """The block's first paragraph and, if the next one is an indented
    detail (``  plm_rsh_agent: /path``), that too: one line of text."""
    paras, cur = [], []
    for line in block:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    if not paras:
        return ""
    text = " ".join(paras[0])
    if len(paras) > 1 and block and any(l.startswith((" ", "\t")) and l.strip() == paras[1][0] for l in block):
        text = text.rstrip(":") + ": " + " ".join(paras[1])
    return " ".join(text.split())


_ERRORISH = re.compile(r"\berror\b|not found|No such file|Segmentation fault|denied|cannot|unable to|failed", re.I)
# A hydra proxy's own line (MPICH, Intel MPI): "[proxy:0:1@HOST] FUNC (file.c:111): message"
_HYDRA_PROXY = re.compile(r"^\[proxy:[\d:]+@([^\]\s]+)\] (?:\S+ \([^)]*\): )?(.*)$")


def daemon_error(lines: list[str]) -> str | None:
    """The first error the MPI runtime's daemons printed, as one line
    (``on HOST: <the daemon's message>``), or None.

    Used for the summary of a launch that failed before any rank did, so
    the cause (a daemon's own message) is on the line users read first
    rather than Open MPI's generic advice 30 lines later. Priority: a
    specific help text, else a stray error line (``sh: orted: not found``),
    else the generic help text.
    """
    blocks = _help_blocks(lines)
    texts = [t for t in map(_first_paragraphs, blocks) if t]
    specific = [t for t in texts if not t.startswith(_GENERIC)]
    in_block = set()
    for b in blocks:
        in_block.update(b)
    stray = [l.strip() for l in lines if l not in in_block and not _HELP_RULE.match(l.strip())
             and not _DAEMON_LINE.match(l) and _ERRORISH.search(l)]
    proxy = [m for m in map(_HYDRA_PROXY.match, stray) if m]
    if not specific and proxy:  # a proxy's own words before mpiexec's about it
        return f"on {proxy[0].group(1)}: {proxy[0].group(2)}"
    text = (specific or stray or texts or [None])[0]
    if text is None:
        return None
    host = next((m.group(1) for m in map(_DAEMON_LINE.match, lines) if m), None)
    return f"on {host}: {text}" if host else text


# ------------------------------------------------------------ tagged output
#
# mpirun tags each *chunk* it forwards, not each line: a rank's line can
# arrive as "[2] {text" ... "[2] \n" with other ranks' chunks in between on
# the same output line (hydra), and Open MPI 4 ends a rank's last line with
# an empty tag ("text[1,3]<stdout>:"). So a line of mpirun output is split
# into (rank, fragment) segments and RankOutput reassembles lines per rank.

# Open MPI 5 puts one space after its tag, Open MPI 4 none: eating an optional
# space under 4 took a real one from the rank's text (seen: with
# PYTHONUNBUFFERED=1, print("rank", 0) arrives as chunks "rank", " ", "0",
# and came out as "rank0").
_OMPI_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>: ?")
_OMPI4_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>:")
# Hydra's "[N] " is only taken as a tag when the line starts with one, so a
# rank printing "[3] " in Open MPI output is left alone.
_HYDRA_TAG = re.compile(r"\[(\d+)\] ?")


def split_tagged(line: str, ompi_tag_space: bool = True) -> list[tuple[int | None, str]]:
    """One line of mpirun output (no newline) -> [(rank or None, fragment), ...].

    ``ompi_tag_space``: Open MPI 5's tag ends with a space of its own (4's does not)."""
    for tag in (_OMPI_TAG if ompi_tag_space else _OMPI4_TAG, _HYDRA_TAG):
        if tag.match(line):
            marks = list(tag.finditer(line))
            return [
                (int(m[1]), line[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(line)])
                for i, m in enumerate(marks)
            ]
    return [(None, line)]


# Open MPI's mpirun (ORTE in 4.x, PRRTE in 5.x) names the rank it saw fail
# first when it aborts a job for a non-zero exit:
#   The first process to do so was:
#     Process name: [[17970,1],3]          (4.x; 5.x: [prterun-host-123@1,3])
#     Exit code:    7
_FIRST_TO_FAIL = re.compile(r"The first process to do so was")
_PROCESS_NAME = re.compile(r"^\s*Process name:\s*\[.*,(\d+)\]\s*$")
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)\s*$")


def first_failed_rank(lines: list[str]) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank mpirun itself says failed, or None.

    mpirun learns of every exit from its daemons in the order they happened;
    the ranks' own status lines travel as output and can come later than a
    rank mpirun ended in the teardown, or not at all when a daemon is ended
    before it forwards them.
    """
    for i, line in enumerate(lines):
        if not _FIRST_TO_FAIL.search(line):
            continue
        rank = None
        for later in lines[i + 1:i + 6]:
            if rank is None and (m := _PROCESS_NAME.match(later)):
                rank = int(m.group(1))
            elif rank is not None and (m := _EXIT_CODE.match(later)):
                return rank, int(m.group(1))
    return None
