"""ssh backend: plain hosts (the job's --hostfile, its names as ssh knows them) with one exec agent each.

``allocate`` starts one ``ssh HOST python3 -c STAGE0`` per host, all at
once, each in a session of its own (a Ctrl-C at the terminal reaches
mpilaunch only). ``wait_ready`` feeds each session's stdin: ``remote.py``,
the package zip (the host needs Python and the MPI, not mpilaunch) and the
job's secret (never in an argv); the host answers with its agent's address.
From there on a job runs as on the local backend: mpirun reaches each host's
agent through ``mpilaunch-rsh`` and the agent transport, and the rank
wrapper, placement check and teardown are the same.

Every way the ssh session ends (``release`` closing its stdin, mpilaunch
killed, the connection lost) ends the host's agent with it
(``--exit-on-stdin-eof``), and the agent ends everything it started: nothing
stays on a host. A session that ends during the run is a lost worker,
named with ssh's own last line.

``--spares K``: the hostfile's next K hosts after the plan's get a session
and agent too, and wait; a spare host that takes a lost or rejected host's
place serves that worker (its slot) under the worker's name
(``spare_pool.py``), and the hostfile's next host, where one remains, is
asked for in its place.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from ...core import hostfile, phases
from ...core.errors import AllocationError, UsageError
from ...core.pylauncher import run_module_code
from ...runtime.image_tools import package_zip
from ..agent_workers import FORWARD_ENV, how_it_ended, write_secret
from ..base import BaseBackend, Capabilities
from ..protocols import ReplacesWorkers
from ..rendezvous import free_port_through_agent, rank_python, source_address
from ..spare_pool import SparePool, served
from .options import SshOptions
from .remote import READY, ZIP_ENV  # ZIP_ENV: the zip's path on the host, in every command the agent runs there

# The host's first program, one line in argv: it runs what comes first on stdin (remote.py's text).
STAGE0 = "import sys; exec(compile(sys.stdin.buffer.read(int(sys.stdin.buffer.readline())), 'mpilaunch-ssh', 'exec'))"
REMOTE = Path(__file__).with_name("remote.py")
# a module of the zip on the host runs as pylauncher's executables run theirs (flush, then os._exit)
ZIP_ON_HOST = "os.environ[" + repr(ZIP_ENV) + "]"
RELEASE_GRACE = 5.0  # for each host's agent to end its sessions and ssh to exit, before ssh is killed
AGENT_MARK = "mpilaunch-agent["  # the agent's log lines, which come through ssh's stderr
# --spares: how long the start waits for the spare hosts once the plan's are up; a spare is worth
# having, not worth a slow start (one that is not up by then is ended and not used)
SPARE_GRACE_S = 10.0


def end_session(proc: subprocess.Popen, grace: float) -> None:
    """An ssh session whose stdin is closed: its agent ends, and ssh with it; killed after ``grace``."""
    with suppress(OSError, ValueError):
        proc.stdin.close()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def remote_command(options: SshOptions, host: str) -> str:
    """What the host's login shell runs: its Python, reading remote.py from stdin."""
    return f"exec {shlex.quote(options.remote_python)} -c {shlex.quote(STAGE0)} {shlex.quote(host)}"


def hosts_after_plan(hosts: list[tuple[str, int]], workers: int) -> list[str]:
    """The hostfile's hosts beyond the plan's: the plan takes the first ones (``plan_from_hostfile``),
    so these are the hosts the job would not use (--spares' hosts, in order)."""
    return [host for host, _ in hosts[workers:]]


def too_few_spare_hosts(spec, plan_hosts: int, left: list[str]) -> UsageError | None:
    """--spares K needs K hosts of its own: a spare is a real other host, never one of the plan's."""
    if len(left) >= spec.spares:
        return None
    sized = f"--np {spec.np}" if spec.np is not None else "no --np (every host)"
    return UsageError(
        f"--spares {spec.spares} needs {spec.spares} host{'s' if spec.spares > 1 else ''} of --hostfile beyond "
        f"the {plan_hosts} the job takes for {sized}, and {spec.hostfile} has {len(left)} more",
        "add hosts to the hostfile (a spare is the next host after the job's), lower --np"
        + (f", or give --spares {len(left)}" if left else ""),
    )


def session_input(secret: bytes) -> bytes:
    """What a session's stdin carries (remote.py's docstring), up to the end that ends it."""
    code, package = REMOTE.read_bytes(), package_zip()  # compressed once per version of the sources
    return b"%d\n%s%d\n%s%s\n" % (len(code), code, len(package), package, secret)


class SshBackend(BaseBackend, ReplacesWorkers):
    name = "ssh"
    options_class = SshOptions
    capabilities = Capabilities(replace_workers=True, spares=True)
    forwards_path = True
    # not checks_program_here: a host need not have this machine's paths (a program installed
    # only on the hosts is common): the first host is asked before mpirun (workloads/program_probe.py)

    @classmethod
    def check_spec(cls, spec) -> None:
        super().check_spec(spec)
        if not spec.hostfile:
            raise UsageError(
                "the ssh backend runs on the hosts of --hostfile, and none was given",
                "write one 'HOST slots=N' line per host (HOST as ssh reaches it: a name, an address "
                "or a Host alias of your ssh config) and add --hostfile FILE",
            )
        client = shlex.split((spec.backend_options or SshOptions()).ssh_command)[0]
        if not shutil.which(client):
            raise UsageError(
                f"the ssh client {client!r} (--ssh-command) is not an executable on PATH",
                "install OpenSSH's client (Debian: openssh-client) or give its path with --ssh-command",
            )

    def __init__(self, spec, plan, rundir, **kw):
        super().__init__(spec, plan, rundir, **kw)
        spare_hosts = hosts_after_plan(hostfile.read(spec.hostfile), len(plan.workers)) if spec.spares else []
        refused = too_few_spare_hosts(spec, len(plan.workers), spare_hosts)
        if refused:
            raise refused
        names = [w.name for w in plan.workers] + spare_hosts
        for host in names:
            if host.startswith("-") or "@" in host or names.count(host) > 1:
                raise UsageError(
                    f"--hostfile names host {host!r} "
                    + ("twice" if names.count(host) > 1 else "in a form ssh would take for an option or a user"),
                    "name each host once, with all its slots ('HOST slots=N'); a login name goes in your ssh "
                    "config (User) or --ssh-option User=NAME",
                )
        self.secret_file = rundir / "secret"
        # keyed by host (a member: the plan's hosts and the spares'); a slot's host is spares.member_of
        self.sessions: dict[str, subprocess.Popen] = {}
        self.facts: dict[str, dict] = {}  # host -> remote.py's line: address, hostname, pid, python
        self._unsent: dict[str, memoryview] = {}  # what each session's stdin has still to get
        self._control: dict[str, str] = {}  # control_address per first host, once asked ("": none)
        # --spares: the hostfile's hosts after the plan's, handed out in order
        self.spares = SparePool.for_plan(plan, names=spare_hosts)

    def _log(self, host: str) -> Path:
        return self.rundir / f"{host}.agent.log"  # ssh's own messages and the agent's log, as they came

    # ---------------------------------------------------------------- allocate, wait_ready

    def allocate(self) -> None:
        write_secret(self.secret_file)
        stdin = session_input(self.secret_file.read_bytes())
        for worker in self.plan.workers:
            self._start_session(worker.name, stdin, worker.name)
        for _ in range(self.spec.spares):  # __init__ made sure the hostfile has them
            self._start_session(self.spares.new_spare().name, stdin)

    def _start_session(self, host: str, stdin: bytes, slot: str | None = None) -> None:
        """ssh to the host, its stdin still to be fed (``wait_ready``); ``slot``: the plan's worker it
        serves (None: a spare, whose phases are no worker's until it serves one)."""
        if slot is not None:
            phases.mark_worker(self.worker_times, slot, "created")
        with open(self._log(host), "ab") as log:
            proc = subprocess.Popen(
                self.options.ssh_argv(host, remote_command(self.options, host)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env=self.launch_environ,
            )
        os.set_blocking(proc.stdin.fileno(), False)
        self.sessions[host] = proc
        self._unsent[host] = memoryview(stdin)

    def _members(self) -> dict[str, str]:
        """host -> the slot (the plan's worker) it serves now."""
        return {self.spares.member_of(w.name): w.name for w in self.plan.workers}

    def spares_waiting(self) -> int:
        for host in list(self.spares.waiting):  # a spare whose session ended waiting is no spare
            if self.sessions[host].poll() is not None:
                self.spares.lost(host)
        return len(self.spares.waiting)

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        """A lost (--retries) or rejected (--preflight enforce) worker's host session ends; a waiting
        spare host serves the worker from then on, and the hostfile's next host, where one remains,
        is asked for in the spare's place. With no spare waiting the same host gets a new session
        and agent, as without --spares. ``wait_ready`` follows; the other hosts keep theirs."""
        stdin = session_input(self.secret_file.read_bytes())
        taken = {}
        for slot in names:
            host = self.spares.member_of(slot)
            end_session(self.sessions.pop(host), grace=RELEASE_GRACE)
            self.facts.pop(host, None)
            spare = self.spares.take(slot, why) if self.spares_waiting() else None
            if spare is None:
                self._start_session(host, stdin, slot)
                continue
            taken[slot] = spare
            for phase in ("created", "ready"):  # the spare's agent was up already
                phases.mark_worker(self.worker_times, slot, phase)
            refill = self.spares.new_spare()
            if refill is not None:
                self._start_session(refill.name, stdin)
        return taken

    def wait_ready(self, deadline: float, progress) -> None:
        """Feed every session its stdin and read each host's line, all at once, until every slot's
        host answered (AllocationError: a session that ended first, with ssh's reason, or the
        deadline). A spare host starting is waited for too, at most SPARE_GRACE_S once the slots'
        hosts are up, and never fails the job: one that ends or is late is not used."""
        members = self._members()
        spare_deadline: float | None = None  # set once the slots' hosts are up
        with selectors.DefaultSelector() as sel:
            for host, proc in self.sessions.items():
                if host not in self.facts:
                    sel.register(proc.stdout, selectors.EVENT_READ, (host, bytearray()))
                    if self._unsent.get(host):
                        sel.register(proc.stdin, selectors.EVENT_WRITE, (host, None))
            while True:
                self._check_started(members)
                self._drop_spares(
                    sel, [h for h in self._spares_starting(members) if self.sessions[h].poll() is not None]
                )
                waiting = [h for h in members if h not in self.facts]
                if not waiting:
                    spare_deadline = spare_deadline or min(deadline, time.monotonic() + SPARE_GRACE_S)
                    late = self._spares_starting(members)
                    if late and time.monotonic() >= spare_deadline:
                        self._drop_spares(sel, late)
                    if not late or time.monotonic() >= spare_deadline:
                        return
                left = (spare_deadline or deadline) - time.monotonic()
                if waiting and left <= 0:  # the spares still starting are released with the job
                    raise AllocationError(
                        f"host{'s' if len(waiting) > 1 else ''} {', '.join(waiting)} did not start mpilaunch's "
                        f"agent within --start-timeout {self.spec.start_timeout:g}s",
                        f"check that `{self.options.ssh_command} {waiting[0]} true` answers at once; a slow "
                        f"host needs a longer --start-timeout (log: {self._log(waiting[0])})",
                    )
                for key, _ in sel.select(max(0.0, min(left, 0.5))):
                    host, line = key.data
                    if line is None:
                        self._send(sel, key.fileobj, host)
                    elif not self._read_line(sel, key.fileobj, host, line):
                        continue
                    elif host in members:
                        phases.mark_worker(self.worker_times, members[host], "ready")
                        progress(sum(h in self.facts for h in members), len(members))
                    else:
                        self.spares.ready(host)

    def _spares_starting(self, members: dict[str, str]) -> list[str]:
        return [h for h in self.sessions if h not in members and h not in self.facts]

    def _drop_spares(self, sel, hosts: list[str]) -> None:
        """Spare hosts that will not serve (ssh ended, or late): their sessions end (the host's agent
        with them) and a line says why; the job goes on without them."""
        for host in hosts:
            proc = self.sessions.pop(host)
            self._unsent.pop(host, None)
            for pipe in (proc.stdin, proc.stdout):
                with suppress(KeyError, ValueError):
                    sel.unregister(pipe)
            late = proc.poll() is None
            if late:
                proc.terminate()  # ssh may still be connecting: nothing to wait for on the host
            end_session(proc, grace=RELEASE_GRACE)
            why = (
                f"its agent did not start within {SPARE_GRACE_S:g}s of the job's hosts"
                if late
                else f"ssh {how_it_ended(proc.returncode)}: {self._last_line(host) or 'no message'}"
            )
            print(
                f"mpilaunch: spare host {host} is not used: {why} (log: {self._log(host)})", file=sys.stderr, flush=True
            )

    def _send(self, sel, pipe, host: str) -> None:
        try:
            sent = os.write(pipe.fileno(), self._unsent[host][: 1 << 16])
        except BlockingIOError:
            return
        except OSError:  # ssh exited: _check_started tells why
            sent = len(self._unsent[host])
        self._unsent[host] = self._unsent[host][sent:]
        if not self._unsent[host]:
            sel.unregister(pipe)

    def _read_line(self, sel, pipe, host: str, received: bytearray) -> bool:
        """Read what came; True once the host's READY line did. Lines before it (a login script's
        chatter) are skipped; after it remote.py writes nothing."""
        chunk = os.read(pipe.fileno(), 4096)
        received += chunk
        for line in bytes(received).split(b"\n")[:-1]:
            if line.startswith(READY):
                self.facts[host] = json.loads(line[len(READY) :])
                sel.unregister(pipe)
                return True
        if not chunk:
            sel.unregister(pipe)  # ssh is ending: _check_started tells why
        return False

    def _check_started(self, members: dict[str, str]) -> None:
        ended = [h for h in members if h not in self.facts and self.sessions[h].poll() is not None]
        if ended:
            host = ended[0]
            serves = f" (spare for {members[host]})" if members[host] != host else ""
            others = f" (and {len(ended) - 1} more host{'s' if len(ended) > 2 else ''})" if len(ended) > 1 else ""
            raise AllocationError(
                f"host {host}{serves}{others}: ssh {self._how(host)} before mpilaunch's agent started there: "
                f"{self._last_line(host) or 'no message'}",
                f"check that `{self.options.ssh_command} {host} {self.options.remote_python} -V` works from "
                f"this machine without a prompt (keys, known hosts, BatchMode); log: {self._log(host)}",
            )

    def _how(self, host: str) -> str:
        return how_it_ended(self.sessions[host].returncode)

    def _last_line(self, host: str) -> str:
        """ssh's last line in the host's log (the agent's own lines come through ssh's stderr too)."""
        with suppress(OSError):
            for line in reversed(self._log(host).read_text(errors="replace").splitlines()):
                if line.strip() and AGENT_MARK not in line:
                    return line.strip()
        return ""

    # ---------------------------------------------------------------- the run

    def exec_context(self) -> dict:
        # no cwd (this machine's need not exist there): mpirun sets the ranks' own
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": list(FORWARD_ENV),
            "workers": served(
                {
                    slot: {"address": self.facts[host]["address"]}
                    for host, slot in self._members().items()
                    if host in self.facts
                },
                self.spares.serving,
            ),
        }

    def control_address(self) -> str | None:
        """This machine's address on its route to the first host: hydra's proxies connect back to it
        (this machine's name need not resolve there). Asked before the hosts are up, so from where
        ssh goes (``ssh -G``); a UDP connect sends nothing. The route to the host that serves the
        first worker (a spare host may sit behind another of this machine's interfaces)."""
        host = self.spares.member_of(self.plan.workers[0].name)
        if host not in self._control:
            address = self.options.resolve(host)
            self._control[host] = (source_address(address) if address else None) or ""
        return self._control[host] or None

    def rendezvous(self, worker: str) -> tuple[str, int] | None:
        """torch.distributed's MASTER_ADDR/MASTER_PORT: the host's agent address and a port free there."""
        facts = self.facts.get(self.spares.member_of(worker))
        return (
            free_port_through_agent(facts["address"], str(self.secret_file), rank_python(self.rank_prefix()))
            if facts
            else None
        )

    def rank_prefix(self) -> list[str]:
        return [self.options.remote_python, "-IS", "-c", run_module_code("mpilaunch.rank", ZIP_ON_HOST)]

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        """The workers whose host's session ended (a spare's that ended waiting is no worker's)."""
        lost = {}
        for host, slot in self._members().items():
            proc = self.sessions.get(host)
            if proc is not None and proc.poll() is not None:
                last = self._last_line(host)
                lost[slot] = f"its ssh session {self._how(host)}" + (f" ({last})" if last else "")
        return lost

    def describe_workers(self) -> dict[str, dict]:
        out = {}
        for worker in self.plan.workers:
            host = self.spares.member_of(worker.name)
            proc, facts = self.sessions.get(host), self.facts.get(host, {})
            state = "not started" if proc is None else ("running" if proc.poll() is None else f"ssh {self._how(host)}")
            # host and pid as result.worker_location reads them: "agent pid P on HOST"
            out[worker.name] = {
                "host": facts.get("hostname") or host,
                "pid": facts.get("pid"),
                "address": facts.get("address"),
                "python": facts.get("python"),
                "ssh_pid": proc.pid if proc else None,
                "state": state,
                **({"spare": host} if host != worker.name else {}),
            }
        return out

    def release(self) -> None:
        """End of stdin for every host: each agent ends what it runs and exits, and ssh with it; ssh
        itself is killed after RELEASE_GRACE (the host's sshd then ends the session: the same end for
        the agent), at once where no agent answered yet (ssh may still be connecting)."""
        for host, proc in self.sessions.items():
            with suppress(OSError, ValueError):
                proc.stdin.close()
                if host not in self.facts and proc.poll() is None:
                    proc.terminate()
        deadline = time.monotonic() + RELEASE_GRACE
        for proc in self.sessions.values():
            end_session(proc, grace=max(0.1, deadline - time.monotonic()))
