"""MPICH's hydra (mpiexec.hydra): detection, argv, machinefile, hints, its proxies' error lines.

The base of the hydra derivatives (Intel MPI: ``intel.py``).
"""

from __future__ import annotations

import re

from .base import LaunchArgs, MpiFlavour, MpiInfo

# MPICH's hydra (and its derivatives) prints "HYDRA build details: Version: 4.0.2".
_VERSION = re.compile(r"HYDRA build details:.*?Version:\s+(\d+[\w.]*)", re.S)
# A hydra proxy's own line (MPICH, Intel MPI): "[proxy:0:1@HOST] FUNC (file.c:111): message"
_PROXY_LINE = re.compile(r"^\[proxy:[\d:]+@([^\]\s]+)\] (?:\S+ \([^)]*\): )?(.*)$")
# Variables hydra (MPICH's and Intel's) reads for its launcher, host list and PMI.
_HYDRA_PREFIXES = ("HYDRA_", "I_MPI_HYDRA_", "I_MPI_PMI")
# mpiexec's answer to a proxy whose first message it cannot parse: hydra's wire format changes
# between MPICH releases (4.0.2's mpiexec with 4.2.1's hydra_pmi_proxy, seen here)
_FOREIGN_PROXY = re.compile(r"cannot find proxy with ID")
VERSION_MISMATCH_HINT = (
    "hydra's mpiexec here and the hydra_pmi_proxy on the workers are different MPICH releases, "
    "which cannot talk to each other: give --mpirun an mpiexec of the workers' MPICH release, "
    "or run mpirun beside the workers (--launcher cluster)"
)
LAUNCH_SETTINGS = "Hydra launch settings (mpilaunch pins the launcher, its agent and the hostfile)"


class Mpich(MpiFlavour):
    name = "mpich"
    title = "MPICH"
    # Debian installs flavour-suffixed links
    executables = ("mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich", "mpiexec", "mpirun")
    abi = "mpich-abi"
    # hydra's proxies connect back to mpiexec by this host's name and start the ranks in
    # mpiexec's directory; in pods neither exists (connect_back_args)
    proxies_connect_back = True
    hostfile_option = "-f"  # MPICH's -f honours ``host:n``

    def parse_version(self, text: str) -> str | None:
        m = _VERSION.search(text)
        return m.group(1) if m else None

    def hostfile_line(self, host: str, slots: int) -> str:
        return f"{host}:{slots}"

    def agent_env(self, shim: str, hostfile: str) -> dict[str, str]:
        return {"HYDRA_LAUNCHER": "rsh", "HYDRA_LAUNCHER_EXEC": shim, "HYDRA_HOST_FILE": hostfile}

    def bootstrap_args(self, shim: str) -> list[str]:
        """The options that make hydra start its proxies through mpilaunch's agent."""
        return ["-launcher", "rsh", "-launcher-exec", shim]

    def argv(self, info: MpiInfo, launch: LaunchArgs) -> list[str]:
        argv = [info.path, "-n", str(launch.ranks), self.hostfile_option, launch.hostfile]
        argv += self.bootstrap_args(launch.shim)
        # the hostfile, not a Slurm/PBS/LSF/SGE allocation, says where ranks go
        argv += ["-rmk", "user"]
        # Forward only what the job needs: the launcher's own HOSTNAME, PATH
        # etc. must not override the worker's. -genvlist takes the values from
        # mpiexec's environment and, like -genvnone, forwards nothing else
        # (hydra accepts only one of them).
        argv += ["-genvlist", ",".join(launch.by_env)] if launch.by_env else ["-genvnone"]
        argv += ["-prepend-rank"]
        for name in launch.on_argv:
            argv += ["-genv", name, launch.values[name]]
        return argv

    def connect_back_args(self, address: str) -> list[str]:
        # the proxies reach mpiexec at this address and start in /; the rank wrapper then goes
        # to the worker's own directory (its --worker-cwd)
        return ["-localhost", address, "-wdir", "/"]

    def proxy_error(self, line: str) -> tuple[str, str] | None:
        m = _PROXY_LINE.match(line)
        return (m.group(1), m.group(2)) if m else None

    def launch_hint(self, lines: list[str]) -> str | None:
        return VERSION_MISMATCH_HINT if any(_FOREIGN_PROXY.search(line) for line in lines) else None

    def agent_setting(self, major: int) -> str:
        return "MPICH takes the agent from -launcher rsh -launcher-exec / HYDRA_LAUNCHER(_EXEC)"

    def pinned_setting(self, name: str) -> str | None:
        return LAUNCH_SETTINGS if name.startswith(_HYDRA_PREFIXES) else None
