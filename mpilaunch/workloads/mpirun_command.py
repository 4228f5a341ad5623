"""The mpirun command of a job: mpirun's argv and environment, the rank wrapper around the user's
command, and what the environment check holds the ranks to (pure but for ``os.geteuid``).

The flavour's own arguments come from its strategy (``core/mpi/``); the workload
(:mod:`.mpirun`) runs the command.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..backends.base import hostnames
from ..core import env_names, envcheck, hostfile, mpi, rank_env
from ..core.spec import JobSpec, Plan
from .base import shim_path


def rank_command(
    spec: JobSpec, prefix: list[str], info: mpi.MpiInfo, attempt: int = 1, worker_cwd: bool = False
) -> list[str]:
    """The per-rank wrapper (``mpilaunch.rank``) around the user's command."""
    wrapper = list(prefix)
    if worker_cwd:
        wrapper.append("--worker-cwd")  # mpirun's directory is not the worker's (see build_launch)
    if spec.bind_gpus:
        wrapper.append("--bind-gpus")
    if attempt > 1:
        wrapper += ["--attempt", str(attempt)]  # the program sees MPILAUNCH_ATTEMPT
    wrapper += mpi.for_name(info.flavour).rank_wrapper_options(info)  # Open MPI: --linger-ms
    return wrapper + ["--"] + list(spec.command)


def rank_variables(plan: Plan, rendezvous: tuple[str, int] | None, token: str | None = None) -> dict[str, str]:
    """What the rank wrapper needs for torch.distributed's variables (rank_env.torch_env), and the
    launch's token for its start and status lines (``env_names.STATUS_TOKEN``; the program does not get it)."""
    out = {rank_env.WORKER_SLOTS_ENV: ",".join(str(w.slots) for w in plan.workers)}
    if token:
        out[env_names.STATUS_TOKEN] = token
    if rendezvous is not None:
        out[rank_env.MASTER_ADDR_ENV], out[rank_env.MASTER_PORT_ENV] = rendezvous[0], str(rendezvous[1])
    return out


def build_launch(
    spec,
    plan,
    info,
    rundir: Path,
    backend,
    environ,
    attempt: int = 1,
    rendezvous: tuple[str, int] | None = None,
    token: str | None = None,
) -> tuple[str, mpi.MpirunCommand]:
    flavour = mpi.for_name(info.flavour)
    hosts = hostnames(plan)
    text = hostfile.render([(hosts[w.name], w.slots) for w in plan.workers], info.hostfile_flavour)
    # hydra's proxies connect back to mpiexec by this host's name and start the ranks in mpiexec's
    # directory; in pods neither exists: give them an address, start in / (connect_back_args),
    # and the rank wrapper goes to the worker's own directory (captured by the shim)
    address = backend.control_address() if flavour.proxies_connect_back else None
    program = rank_command(spec, backend.rank_prefix(), info, attempt, worker_cwd=bool(address))
    command = mpi.build_mpirun(
        info,
        ranks=plan.ranks,
        hosts=len(plan.workers),
        hostfile=str(rundir / "hostfile"),
        shim=shim_path(rundir),
        command=program,
        environ=environ,
        user_env=spec.env,
        extra_args=spec.mpi_args,
        as_root=os.geteuid() == 0,
        rank_env=rank_variables(plan, rendezvous, token),
    )
    # Open MPI 4: no host lookups; the user's --mpi-args tune the daemons' launch (mpi/openmpi.py)
    mpi.for_name(info.flavour).tune_launch(info, command, spec.mpi_args, len(program))
    command.env[env_names.CONTEXT] = str(rundir / "context.json")
    if address:
        command.argv[1:1] = flavour.connect_back_args(address)
    # workers that are sent this machine's PATH (local, YARN) get it from here, before mpirun's
    # prefix; -x PATH=... already put the user's there (forwarded to the ranks from this environment)
    if "PATH" in environ:
        command.env.setdefault(mpi.WORKER_PATH_ENV, environ["PATH"])
    return text, command


def expected_environment(spec, info, command: mpi.MpirunCommand, backend, environ) -> envcheck.Expected:
    """What the environment check holds the ranks to. The program is resolved here only where the
    workers get this machine's PATH (``backend.forwards_path``); elsewhere the ranks must agree."""
    first = spec.command[0] if spec.command else ""
    path = command.forwarded.get("PATH", environ.get("PATH", ""))
    program = rank_env.resolve_program(first, path) if first and backend.forwards_path else None
    return envcheck.Expected(
        command=first,
        program=program,
        flavour=info.flavour,
        major=info.major,
        mpirun=info.path,
        version=info.version,
        env_digest=rank_env.digest(command.forwarded.items()),
        forwarded=dict(command.forwarded),
        prepended_dirs=mpi.for_name(info.flavour).prepended_dirs(info),
    )


def without_stale_session(argv: list[str], info: mpi.MpiInfo) -> list[str]:
    """mpirun's argv, behind the stale-session sweep where the MPI needs it (Open MPI 5:
    mpi.openmpi.CLEAR_STALE_SESSION)."""
    return mpi.for_name(info.flavour).spawn_argv(info, argv)
