"""Open MPI 4 (ORTE) and 5 (PRRTE): detection, argv, hostfile, rank wrapper, hints, failure lines."""

from __future__ import annotations

import os
import re

from .base import LaunchArgs, MpiFlavour, MpiInfo, MpirunCommand

# Resource-manager components Open MPI (ORTE and PRRTE) may pick up from the
# environment; excluded so the hostfile is the only host list. Excluding a
# component an installation lacks is accepted by both.
RAS_EXCLUDED = "^slurm,gridengine,tm,pbs,lsf,alps,flux"
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
# Open MPI 4's mpirun looks every hostfile name up (getaddrinfo, 4 lookups a
# name in orte_util_add_hostfile_nodes -> opal_ifislocal) to find out which
# host is its own. mpilaunch's workers never are (each is reached through the
# shim; local workers' names resolve nowhere by design), so these are DNS
# queries for names that do not exist, one after the other: 1024 queries at
# 256 workers, and a resolver that drops one costs its 5 s timeout. Measured on
# the 2-core VM (its resolver drops ~3% of queries: 2 of 64 getaddrinfo calls
# took 5 s): `mpirun true` with the /bin/sh-agent floor, 16 one-slot hosts,
# 10.6-10.8 s -> 0.44-0.63 s, and mpilaunch --np 16 11.1 s -> 1.0-1.2 s (strace:
# 192 DNS connects by mpirun -> 0). Open MPI 5's PRRTE makes no such lookups.
# Added by tune_launch (a job's launch, not build_mpirun's pure argv).
ORTE_NO_HOST_LOOKUPS = {"if_base_do_not_resolve": "1"}
# Open MPI's daemons (4.x orted and 5.x prted alike) can drop a process's
# last output when they reap the process before draining its pipe. Seen: 1
# status line in ~4 runs lost on 4.x; on 5.x, ranks 0 and 3 failing with busy
# loops beside the job, a failed rank's "exit=7" line was lost in 9 of 60 runs
# without the linger and in 0 of 60 with it (A/B interleaved); MPICH's hydra
# lost none in 15 such runs. The rank wrapper's --linger-ms waits only until
# the daemon has read its pipe (usually under a millisecond), this at most.
LINGER_MS = 100
# Open MPI 5's mpirun keeps its session in $TMPDIR/ompi.<its pid>; one that
# was SIGKILLed leaves it behind, and the next mpirun that gets the same pid
# (pid_max is often 32768) fails: "The PMIx server's listener thread failed to
# start", exit 213. Through sh, the directory of the pid mpirun is about to
# have (sh's own, kept by exec) is removed first: it cannot belong to a live
# process. The test keeps the common case (nothing stale) to sh alone: an
# unconditional rm cost an exec on every launch.
CLEAR_STALE_SESSION = 'd="${TMPDIR:-/tmp}/ompi.$$"; [ ! -e "$d" ] || rm -rf "$d"; exec "$@"'

# Open MPI 4 and 5 name themselves ("mpirun (Open MPI) 5.0.11", Debian's 4.1
# "mpirun.openmpi (OpenRTE) 4.1.4").
_VERSION = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+[\w.]*)")
# A daemon's own line: "[w-1:01234] ... error" (the host names where it failed).
_DAEMON_LINE = re.compile(r"^\[([^\]:\s]+):\d+\] .*(?:FORCE-TERMINATE|Segmentation fault|error|ERROR)")
# mpirun (ORTE in 4.x, PRRTE in 5.x) names the rank it saw fail first when it
# aborts a job for a non-zero exit:
#   The first process to do so was:
#     Process name: [[17970,1],3]          (4.x; 5.x: [prterun-host-123@1,3])
#     Exit code:    7
_FIRST_TO_FAIL = re.compile(r"The first process to do so was")
_PROCESS_NAME = re.compile(r"^\s*Process name:\s*\[.*,(\d+)\]\s*$")
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)\s*$")
# MCA parameter names (after OMPI_MCA_ / PRTE_MCA_ / PMIX_MCA_) that choose
# how daemons are started, where, and with which host list.
_MCA_LAUNCH = (
    "plm",
    "ras",
    "orte_default_hostfile",
    "prte_default_hostfile",
    "orte_rsh_agent",
    "prte_rsh_agent",
    "orte_launch_agent",
    "prte_launch_agent",
)
_MCA_PREFIXES = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_")
LAUNCH_SETTINGS = "Open MPI launch settings (mpilaunch pins plm, ras, the hostfile and the rsh agent)"


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


# How mpirun starts and wires its daemons: mpilaunch sets each of these (``_params``), and a
# value of the user's own (``--mpi-args "--mca routed_radix 16"``) replaces mpilaunch's
# (``yield_to_user``): Open MPI 4 refuses a parameter named twice on its command line
# ("MCA parameters can only be listed once"), so without this none could be tuned.
# The launch's pinned parameters (plm, ras, the agent, the hostfile) stay mpilaunch's.
TUNABLE = frozenset({"no_tree_spawn", "num_concurrent", "routed_radix", "if_base_do_not_resolve"})
_MCA_OPTIONS = frozenset(
    {"--mca", "-mca", "--omca", "-omca", "--gmca", "-gmca", "--prtemca", "-prtemca", "--pmixmca", "-pmixmca"}
)


def _tunable(name: str) -> str | None:
    """The TUNABLE name of an MCA parameter (``plm_rsh_num_concurrent`` and ``plm_ssh_...`` alike)."""
    for prefix in ("plm_rsh_", "plm_ssh_"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name if name in TUNABLE else None


def user_tuning(extra_args) -> set[str]:
    """The TUNABLE parameters the user's extra mpirun arguments set."""
    args = list(extra_args)
    return {t for i, a in enumerate(args[:-2]) if a in _MCA_OPTIONS and (t := _tunable(args[i + 1]))}


def tune_launch(info: MpiInfo, command: MpirunCommand, extra_args, program_words: int) -> None:
    """A job's mpirun (``workloads.mpirun_command.build_launch``; the benchmarks' floor alike): the
    launch-scale settings, before the user's extra arguments (``extra_args``, followed in argv
    by the ``program_words`` of the rank command), whose TUNABLE values then replace mpilaunch's."""
    if info.major < 5:
        at = len(command.argv) - len(extra_args) - program_words
        for key, value in ORTE_NO_HOST_LOOKUPS.items():
            command.argv[at:at] = ["--mca", key, value]
            command.env["OMPI_MCA_" + key] = value
            at += 3
    yield_to_user(command, extra_args, program_words)


def yield_to_user(command: MpirunCommand, extra_args, program_words: int = 0) -> None:
    """Drop mpilaunch's own value of every TUNABLE parameter that ``extra_args`` sets, from argv
    and environment. ``build_mpirun`` put ``extra_args`` after mpilaunch's options and before
    the ``program_words`` of the rank command; only mpilaunch's options are looked at."""
    names = user_tuning(extra_args)
    if not names:
        return
    argv = command.argv
    end = len(argv) - len(extra_args) - program_words
    drop = {i for i in range(end - 2) if argv[i] in _MCA_OPTIONS and _tunable(argv[i + 1]) in names}
    argv[:] = [a for i, a in enumerate(argv) if not any(j <= i < j + 3 for j in drop)]
    for key in [k for k in command.env if k.startswith(_MCA_PREFIXES) and _tunable(k.split("_MCA_", 1)[1]) in names]:
        del command.env[key]


def is_mca_launch(name: str) -> bool:
    for prefix in _MCA_PREFIXES:
        if name.startswith(prefix):
            param = name[len(prefix) :]
            return any(param == p or param.startswith(p + "_") for p in _MCA_LAUNCH)
    return False


class OpenMpi(MpiFlavour):
    name = "openmpi"
    title = "Open MPI"
    supported = "Open MPI 4/5"
    # Debian installs flavour-suffixed links
    executables = ("mpirun.openmpi", "mpirun", "mpiexec")
    abi = "openmpi"
    generic_daemon_advice = (
        "ORTE was unable to reliably start",
        "PRTE has lost communication",
        "ORTE has lost communication",
        "An ORTE daemon has unexpectedly failed",
        "PRTE was unable to reliably start",
    )

    def parse_version(self, text: str) -> str | None:
        m = _VERSION.search(text)
        return m.group(1) if m else None

    def hostfile_line(self, host: str, slots: int) -> str:
        return f"{host} slots={slots}"

    def agent_env(self, shim: str, hostfile: str) -> dict[str, str]:
        # Open MPI 5 ignores the OMPI_ names (field notes), Open MPI 4 ignores the PRTE_ ones.
        return {
            "OMPI_MCA_plm_rsh_agent": openmpi_agent(shim),
            "OMPI_MCA_orte_default_hostfile": hostfile,
            "PRTE_MCA_plm_ssh_agent": openmpi_agent(shim),
            "PRTE_MCA_prte_default_hostfile": hostfile,
        }

    @staticmethod
    def _runtime(info: MpiInfo) -> tuple[list[str], str, str, str]:
        """(tag option, MCA option, plm prefix, MCA environment prefix): Open MPI 5 (PRRTE) reads
        only the ssh/PRTE names, 4 only the rsh/OMPI ones."""
        if info.major >= 5:
            return ["--output", "tag"], "--prtemca", "plm_ssh", "PRTE_MCA_"
        return ["--tag-output"], "--mca", "plm_rsh", "OMPI_MCA_"

    def _params(self, info: MpiInfo, launch: LaunchArgs) -> dict[str, str]:
        _, _, plm, _ = self._runtime(info)
        params = {
            # pinned here: the environment (an image's OMPI_MCA_plm=isolated, a
            # Slurm allocation) must not choose the launch (inherited.py)
            "plm": plm.split("_")[1],
            "ras": RAS_EXCLUDED,
            f"{plm}_agent": openmpi_agent(launch.shim),
            f"{plm}_no_tree_spawn": "1",
            f"{plm}_num_concurrent": str(max(MIN_NUM_CONCURRENT, launch.hosts)),
            "routed_radix": str(max(MIN_ROUTED_RADIX, launch.hosts + 1)),
        }
        if info.major >= 5:
            params.update(PRRTE_SPAWN_ON_PROGRESS_THREAD)
        return params

    def argv(self, info: MpiInfo, launch: LaunchArgs) -> list[str]:
        argv = [info.path]
        if launch.as_root:
            argv.append("--allow-run-as-root")
        argv += ["-np", str(launch.ranks), "--hostfile", launch.hostfile, "--map-by", "slot", "--bind-to", "none"]
        tag, mca, _, _ = self._runtime(info)
        argv += tag
        # Without tree spawn a daemon daemonizes (setsid, fork, output to
        # /dev/null) and its agent returns at once: a daemon that then dies
        # says nothing and mpirun waits for it forever (seen on real pods).
        # Attached, the daemon lives inside its agent's session: its error
        # reaches mpirun's stderr and its death ends the agent, so mpirun
        # fails. (Open MPI 4 and 5 both take this flag; 5 has no MCA name.)
        argv.append("--leave-session-attached")
        for key, value in self._params(info, launch).items():
            argv += [mca, key, value]
        # -x NAME (no value): mpirun exports NAME from its own environment (4.1 and 5)
        for name in launch.names:
            argv += ["-x", f"{name}={launch.values[name]}" if name in launch.on_argv else name]
        return argv

    def env(self, info: MpiInfo, launch: LaunchArgs) -> dict[str, str]:
        # the same parameters in the environment as well as on the command line
        _, _, _, env_prefix = self._runtime(info)
        return {env_prefix + k: v for k, v in self._params(info, launch).items()}

    def tune_launch(self, info: MpiInfo, command: MpirunCommand, extra_args, program_words: int) -> None:
        tune_launch(info, command, extra_args, program_words)

    def rank_wrapper_options(self, info: MpiInfo) -> list[str]:
        return ["--linger-ms", str(LINGER_MS)]

    def needs_own_hostnames(self, info: MpiInfo) -> bool:
        # Open MPI 5's PRRTE (3.0.11 in 5.0.11) renames each hostfile node to the host name its
        # daemon reports (prte_plm_base_daemon_callback), which is gethostname() and nothing else
        # (prte_setup_hostname). Two workers' daemons on one machine make two nodes of one name;
        # PMIx 5.0's client merges nodes by name (gds/hash: pmix_gds_hash_check_nodename), so
        # every rank's PMIX_LOCAL_PEERS is the last node's: "2,3" for all four ranks of --np 4 on
        # two local workers. Open MPI then takes ranks 2 and 3 for its node-mates and its own
        # neighbour for a stranger: MPI_COMM_TYPE_SHARED gives [0,2,3], [1,2,3], [2,3], [2,3], and
        # Horovod's MPI controller waits for ever in hvd.init(). Open MPI 4.1 splits the same
        # workers right.
        return info.major >= 5

    def prepended_dirs(self, info: MpiInfo) -> tuple[str, ...]:
        # mpirun run by its absolute path acts as --prefix <its prefix> and puts <prefix>/lib
        # ahead of every rank's LD_LIBRARY_PATH, even a forwarded one that has it already
        # (seen: /usr/bin/mpirun.openmpi, -x LD_LIBRARY_PATH=/usr/lib -> /usr/lib:/usr/lib)
        if not os.path.isabs(info.path):
            return ()
        prefix = os.path.dirname(os.path.dirname(info.path))
        return (os.path.join(prefix, "lib"), os.path.join(prefix, "lib64"))

    def spawn_argv(self, info: MpiInfo, argv: list[str]) -> list[str]:
        if info.major >= 5:
            return ["/bin/sh", "-c", CLEAR_STALE_SESSION, "mpirun", *argv]
        return list(argv)

    def tag_has_space(self, major: int) -> bool:
        # Open MPI 5 puts one space after its tag, Open MPI 4 none (an unknown major: as 5)
        return not 0 < major < 5

    def first_failed_rank(self, lines: list[str]) -> tuple[int, int] | None:
        for i, line in enumerate(lines):
            if not _FIRST_TO_FAIL.search(line):
                continue
            rank = None
            for later in lines[i + 1 : i + 6]:
                if rank is None and (m := _PROCESS_NAME.match(later)):
                    rank = int(m.group(1))
                elif rank is not None and (m := _EXIT_CODE.match(later)):
                    return rank, int(m.group(1))
        return None

    def daemon_host(self, line: str) -> str | None:
        m = _DAEMON_LINE.match(line)
        return m.group(1) if m else None

    def agent_setting(self, major: int) -> str:
        if major >= 5:
            return (
                "Open MPI 5 takes the agent only from --prtemca plm_ssh_agent / PRTE_MCA_plm_ssh_agent "
                "and ignores OMPI_MCA_plm_rsh_agent"
            )
        return (
            "Open MPI 4 takes the agent from --mca plm_rsh_agent / OMPI_MCA_plm_rsh_agent "
            "and ignores the PRTE_MCA_ names"
        )

    def pinned_setting(self, name: str) -> str | None:
        return LAUNCH_SETTINGS if is_mca_launch(name) else None
