"""A real sshd testbed: a few hosts on this machine, each in its own network namespace, reached over ssh.

Each host is a network namespace (``ip netns``) with one veth into a bridge
on this machine and an address of its own (10.a.b.N/24), its own host name
(a UTS namespace: ``hostname`` there says its alias), its own TMPDIR
(node-local, like a cluster node's /tmp) and its own OpenSSH sshd on port 22
of its address: a generated host key, public key login only, as
``mpilaunch-user`` when that user exists (scripts/nonroot-user.sh), else
root. The hosts resolve each other's names (their own /etc/hosts, bound
over this machine's in a mount namespace of each sshd; no DNS server). They
share this machine's filesystem otherwise (the software paths are the same
everywhere, as on a cluster with a shared filesystem) and its pid namespace
(a test sees every host's processes; ``processes`` tells them apart by
network namespace).

The client side is a generated ``ssh_config``: one alias per host
(HostName, Port, User, IdentityFile, UserKnownHostsFile holding the host
keys, BatchMode). Nothing of this machine's ``~/.ssh`` or ``/etc/ssh`` is
read or written, nor is /etc/hosts (the hosts' own is bound over it in
their mount namespaces only); the one thing made outside the work directory
is sshd's privilege separation directory ``/run/sshd``, which sshd insists on.

Needs root, ``ip`` (iproute2), ``unshare`` (util-linux), ``sshd``
(openssh-server), ``ssh`` and ``ssh-keygen`` (openssh-client). Standard
library only.

    with SshCluster(["node-1", "node-2"]) as bed:
        subprocess.run([*bed.ssh_argv, "node-1", "hostname"])   # node-1

``python3 -m testbeds.ssh.cluster [N]`` starts N hosts, prints the ssh
command and waits for Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import links

SSHD = "/usr/sbin/sshd"
PREFERRED_USER = os.environ.get("MPILAUNCH_NONROOT_USER", "mpilaunch-user")


def missing_prerequisites() -> list[str]:
    missing = [] if os.geteuid() == 0 else ["root (network namespaces)"]
    for tool, package in (
        (SSHD, "openssh-server"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
    ):
        if not shutil.which(tool):
            missing.append(f"{tool} ({package})")
    return missing


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200-249.x.0 that no address or route of this machine is in (another testbed's either)."""
    used = [
        ipaddress.ip_interface(word).network
        for line in _run("ip", "-4", "-o", "addr").splitlines()
        for word in line.split()[3:4]
    ]
    used += [
        ipaddress.ip_network(line.split()[0]) for line in _run("ip", "-4", "route").splitlines() if line[:1].isdigit()
    ]
    for _ in range(100):
        a, b = os.urandom(2)
        net = ipaddress.ip_network(f"10.{200 + a % 50}.{b}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.200-249.x.0/24 subnet on this machine")


class SshCluster:
    def __init__(self, hosts=("node-1", "node-2", "node-3"), user: str | None = None):
        self.hosts = list(hosts)
        self.user = user or (PREFERRED_USER if _user_exists(PREFERRED_USER) else "root")
        self.tag = os.urandom(2).hex()  # names this testbed's namespaces and links beside any other's
        self.workdir: Path | None = None
        self.addresses: dict[str, str] = {}
        self._sshd: dict[str, subprocess.Popen] = {}
        self._links: dict[str, str] = {}  # host -> its veth's end on this machine (in the bridge)
        self._bridge = f"sshbr-{self.tag}"

    # ---------------------------------------------------------------- the client's view

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config)]

    @property
    def ssh_command(self) -> str:
        """The ssh command, as one string (mpilaunch's --ssh-command)."""
        return f"ssh -F {self.ssh_config}"

    def netns(self, host: str) -> str:
        return f"sshbed-{self.tag}-{host}"

    def link(self, host: str) -> tuple[str, str]:
        """(the host's veth end on this machine, in the bridge; its own end, ``eth0`` in its
        namespace): where a test shapes the host's traffic (tests/support/faults.py slow_link)."""
        return self._links[host], "eth0"

    def host_tmp(self, host: str) -> Path:
        """The host's own TMPDIR (sshd sets it for every session there)."""
        return self.workdir / "hosts" / host / "tmp"

    def ssh(self, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.ssh_argv, host, command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    # ---------------------------------------------------------------- what runs on a host

    def pids(self, host: str) -> list[int]:
        """Every process in the host's network namespace, its sshd included."""
        return [int(p) for p in _run("ip", "netns", "pids", self.netns(host)).split()]

    def processes(self, host: str) -> list[str]:
        """What runs on the host besides its listening sshd: ``"PID USER: CMDLINE"`` each."""
        listener = self._sshd[host].pid
        return [_describe(pid) for pid in self.pids(host) if pid != listener and _alive(pid)]

    def sshd_pid(self, host: str) -> int:
        """The host's listening sshd: every session (and all it starts) is forked from it."""
        return self._sshd[host].pid

    def leftovers(self, host: str) -> list[str]:
        """Processes (``processes``) and files in the host's TMPDIR: what a finished job must not leave."""
        tmp = self.host_tmp(host)
        return self.processes(host) + [f"{tmp}/{name}" for name in sorted(os.listdir(tmp))]

    def kill_sessions(self, host: str) -> list[int]:
        """SIGKILL every sshd session process on the host (its connections drop as if it crashed);
        the listener stays, so the host takes new logins. Returns the pids killed."""
        listener = self._sshd[host].pid
        killed = []
        for pid in self.pids(host):
            if pid != listener and _cmdline(pid).startswith("sshd:"):
                _signal(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def unplug(self, host: str) -> None:
        """Pull the host's cable: its link into the bridge goes down (a new connection gets
        "No route to host" once ARP gives up; an open one sees nothing at all)."""
        _run("ip", "link", "set", self._links[host], "down")

    def plug(self, host: str) -> None:
        _run("ip", "link", "set", self._links[host], "up")

    # ---------------------------------------------------------------- life cycle

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> "SshCluster":
        missing = missing_prerequisites()
        if missing:
            raise RuntimeError("the ssh testbed needs " + ", ".join(missing))
        self.workdir = Path(tempfile.mkdtemp(prefix="sshbed-"))
        os.chmod(self.workdir, 0o755)  # sshd reads authorized_keys as the user; host keys stay 0600
        try:
            self._keys()
            self._network()
            self._name_service()
            for host in self.hosts:
                self._start_sshd(host)
            self._write_client_config()
            for host in self.hosts:
                self._wait_login(host)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process of every host, delete the namespaces and the bridge, remove the work
        directory. Idempotent; never raises."""
        for host in self.hosts:
            try:
                for pid in self.pids(host):
                    _signal(pid, signal.SIGKILL)
            except RuntimeError:
                pass  # no such namespace (yet, or any more)
        for proc in self._sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", self.netns(host)], capture_output=True)
        links.remove_link(self._bridge)  # at once, or at the test run's end (links.py: other sessions' MPI jobs)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _keys(self) -> None:
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "mpilaunch ssh testbed",
            "-f",
            str(self.workdir / "client_key"),
        )
        (self.workdir / "authorized_keys").write_text((self.workdir / "client_key.pub").read_text())
        os.chmod(self.workdir / "authorized_keys", 0o644)
        known = []
        for host in self.hosts:
            key = self.workdir / "hosts" / host / "host_key"
            key.parent.mkdir(parents=True)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host, "-f", str(key))
            known.append(host)
        self._host_keys = {h: (self.workdir / "hosts" / h / "host_key.pub").read_text().split()[:2] for h in known}

    def _network(self) -> None:
        net = _free_subnet()
        addresses = list(net.hosts())
        gateway = str(addresses[0])
        _run("ip", "link", "add", self._bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{gateway}/{net.prefixlen}", "dev", self._bridge)
        _run("ip", "link", "set", self._bridge, "up")
        for i, host in enumerate(self.hosts):
            ns, outside, inside = self.netns(host), f"sshv{self.tag}{i}", f"sshp{self.tag}{i}"
            address = str(addresses[10 + i])
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            _run("ip", "link", "set", outside, "master", self._bridge, "up")
            _run("ip", "link", "set", inside, "netns", ns)
            _run("ip", "-n", ns, "link", "set", inside, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # this machine's other addresses (where mpirun may listen too) through the bridge
            _run("ip", "-n", ns, "route", "add", "default", "via", gateway)
            self.addresses[host] = address
            self._links[host] = outside

    def _name_service(self) -> None:
        machine = Path("/etc/hosts").read_text()
        names = "".join(f"{self.addresses[h]} {h}\n" for h in self.hosts)
        (self.workdir / "etc-hosts").write_text(f"{machine.rstrip()}\n# the ssh testbed's hosts\n{names}")
        (self.workdir / "resolv.conf").write_text("# the ssh testbed's hosts: no DNS server\n")

    def _start_sshd(self, host: str) -> None:
        home = self.workdir / "hosts" / host
        user = pwd.getpwnam(self.user)
        tmp = self.host_tmp(host)
        tmp.mkdir(mode=0o700)
        os.chown(tmp, user.pw_uid, user.pw_gid)
        config = home / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.addresses[host]}",
                    "Port 22",
                    f"HostKey {home / 'host_key'}",
                    "PidFile none",
                    f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                    "StrictModes no",  # the key file is under /tmp, which is world-writable
                    f"AllowUsers {self.user}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM yes",  # Debian's useradd locks the password ("!"), which only PAM lets a key log in past
                    f"SetEnv TMPDIR={tmp}",
                    # a session whose client vanished (a pulled cable) ends within 3 s, not after TCP's hours
                    "ClientAliveInterval 1",
                    "ClientAliveCountMax 3",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        log = open(home / "sshd.log", "ab")
        # Its own host name, and name service: the hosts' names in its /etc/hosts, no DNS server (the
        # machine's is not reachable from a host: queries would wait out their timeouts). ip netns exec
        # and unshare exec (no fork), sh execs sshd: the Popen's pid is sshd's listener.
        self._sshd[host] = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.netns(host),
                "unshare",
                "--uts",
                "--mount",
                "sh",
                "-c",
                'hostname "$1" && mount --bind "$4/etc-hosts" /etc/hosts && '
                'mount --bind "$4/resolv.conf" /etc/resolv.conf && exec "$2" -D -e -f "$3"',
                "sh",
                host,
                SSHD,
                str(config),
                str(self.workdir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def _write_client_config(self) -> None:
        known = "".join(f"{self.addresses[h]} {' '.join(self._host_keys[h])}\n" for h in self.hosts)
        (self.workdir / "known_hosts").write_text(known)
        blocks = []
        for host in self.hosts:
            blocks.append(
                "\n".join(
                    [
                        f"Host {host}",
                        f"  HostName {self.addresses[host]}",
                        "  Port 22",
                        f"  User {self.user}",
                        f"  IdentityFile {self.workdir / 'client_key'}",
                        "  IdentitiesOnly yes",
                        f"  UserKnownHostsFile {self.workdir / 'known_hosts'}",
                        "  GlobalKnownHostsFile /dev/null",
                        "  StrictHostKeyChecking yes",
                        "  BatchMode yes",
                        "  ConnectTimeout 10",
                        "",
                    ]
                )
            )
        self.ssh_config.write_text("\n".join(blocks))

    def _wait_login(self, host: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._sshd[host].poll() is not None:
                log = (self.workdir / "hosts" / host / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"sshd of {host} exited with {self._sshd[host].returncode}: {log.strip()[-500:]}")
            proc = self.ssh(host, "hostname", timeout=timeout)
            if proc.returncode == 0 and proc.stdout.strip() == host:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no ssh login to {host} in {timeout:g}s: {proc.stderr.strip()[-500:]}")
            time.sleep(0.2)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _describe(pid: int) -> str:
    try:
        user = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        user = "?"
    return f"{pid} {user}: {_cmdline(pid)[:160]}"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(args[0]) if args else 2
    with SshCluster([f"node-{i + 1}" for i in range(count)]) as bed:
        print(f"hosts: {', '.join(f'{h} ({bed.addresses[h]})' for h in bed.hosts)}; user {bed.user}")
        print(f"ssh:   {bed.ssh_command} {bed.hosts[0]} hostname")
        print("Ctrl-C stops them")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
