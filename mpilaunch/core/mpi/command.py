"""The exact mpirun argv and environment of one job: what the ranks get is decided here, the
same for every flavour; how mpirun is told is the flavour's (``registry.for_name(...).argv``)."""

from __future__ import annotations

from .. import env_names
from ..rank_env import FORWARDED_LIST_ENV, WORKER_PATH_ENV, forwarded_list
from .base import LaunchArgs, MpiInfo, MpirunCommand
from .registry import FLAVOURS, for_name

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
#
# Forwarded values travel in mpirun's environment, never on its command line
# (``ps`` shows every user's argv on a shared login node: ``-x HF_TOKEN``):
# argv names them (Open MPI's ``-x NAME``, Hydra's ``-genvlist A,B``) and
# mpirun takes each value from its own environment. These few are mpirun's
# own loader and search paths too: a value of the user's that differs from
# mpirun's own stays on the command line rather than changing how mpirun
# itself starts (they are paths, not secrets).
MPIRUN_OWN_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD")
# mpilaunch's own variable that --dry-run masks like the user's values
# (env_names.STATUS_TOKEN: a program that knew it could forge its rank's status line)


def forwarded_names(environ: dict[str, str], user_env: tuple[str, ...]) -> list[str]:
    """Variables every rank must see: NCCL_*, HOROVOD_*, PYTHONPATH and -x names."""
    names = sorted(n for n in environ if n.startswith(FORWARDED_PREFIXES) or n in FORWARDED_NAMES)
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


def agent_env(shim: str, hostfile: str) -> dict[str, str]:
    """Agent and hostfile under every name any flavour reads.

    Set for all flavours so that tools run *inside* the job (horovodrun,
    a nested mpirun) find the same agent.
    """
    env: dict[str, str] = {}
    for flavour in FLAVOURS.values():
        env.update(flavour.agent_env(shim, hostfile))
    return env


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
    flavour = for_name(info.flavour)
    names = forwarded_names(environ, user_env)
    values = resolve_env(names, user_env, environ)
    own = dict(rank_env or {})
    if "PATH" in values:  # -x PATH=...: the rank's program gets it, not mpirun's prefix ahead of it
        own[WORKER_PATH_ENV] = values["PATH"]
    forwarded = {n: values[n] for n in names if n in values}
    own[FORWARDED_LIST_ENV] = forwarded_list(forwarded)
    names = names + [n for n in own if n not in names]
    values.update(own)
    for name, value in flavour.rank_env(info).items():  # Intel MPI: its library directory
        names.append(name)
        values[name] = value
    names = [n for n in names if n in values]
    on_argv = [n for n in names if n in MPIRUN_OWN_NAMES and values[n] != environ.get(n)]
    by_env = [n for n in names if n not in on_argv]
    # the launch's own settings below win over a forwarded name that collides with one
    env = {n: values[n] for n in by_env}
    env.update(agent_env(shim, hostfile))
    masked = frozenset(n for n in by_env if n in forwarded or n == env_names.STATUS_TOKEN)
    launch = LaunchArgs(
        ranks=ranks,
        hosts=hosts,
        hostfile=hostfile,
        shim=shim,
        as_root=as_root,
        names=names,
        values=values,
        on_argv=on_argv,
        by_env=by_env,
    )
    env.update(flavour.env(info, launch))
    argv = flavour.argv(info, launch) + list(extra_args) + list(command)
    return MpirunCommand(argv=argv, env=env, forwarded=forwarded, masked=masked)
