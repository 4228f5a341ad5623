"""A host name of its own for a worker that shares its machine with other workers (the local backend).

Open MPI 5's runtime knows a node by the host name its daemon reports (gethostname(), nothing
else: PRRTE 3.0 has no parameter for it), and renames the hostfile's node to it. Two workers'
daemons on one machine report the same name, so the job's map holds two nodes of one name;
each rank's PMIx client merges them by that name and takes the last one's local peers as its
own (``OpenMpi.needs_own_hostnames`` in core/mpi/openmpi.py). In a UTS namespace of its own,
named after its worker, an agent's daemon reports the worker's name, as a pod's would.

And as in a pod, the name resolves there: programs look their own host name up (Horovod's
Gloo controller binds to the address of gethostname() and fails on a name that resolves
nowhere, "Unable to find address for: <job>-worker-1"). Kubelet writes the pod's name into
the pod's /etc/hosts; here the agent's own mount namespace gets an /etc/hosts that adds the
worker's name on a loopback address, bound over the machine's for this worker's processes only.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile

from ..core.exit_codes import EXIT_FAILED

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000
HOST_NAME_MAX = 64  # Linux's limit on sethostname()
HOSTS = "/etc/hosts"
# where the worker's name resolves (Debian's address for a machine's own name: any 127/8 address
# is this machine's loopback)
OWN_ADDRESS = "127.0.1.1"


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.unshare.argtypes = [ctypes.c_int]
    return ctypes, libc


def _check(ctypes, result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    ctypes, libc = _libc()
    _check(ctypes, libc.unshare(flags), "unshare")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def hosts_text(current: str, name: str) -> str:
    """The worker's /etc/hosts: the machine's, and ``name`` on OWN_ADDRESS."""
    return (current if not current or current.endswith("\n") else current + "\n") + f"{OWN_ADDRESS}\t{name}\n"


def _resolve_here(name: str) -> None:
    """``name`` resolves in this mount namespace: an /etc/hosts of its own, bound over the machine's."""
    ctypes, libc = _libc()
    # first, no mount of ours may reach the machine's namespace (systemd makes / shared)
    _check(ctypes, libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    with open(HOSTS) as f:
        current = f.read()
    fd, path = tempfile.mkstemp(prefix="mpilaunch-hosts-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(hosts_text(current, name))
        os.chmod(path, 0o644)
        _check(ctypes, libc.mount(path.encode(), HOSTS.encode(), None, MS_BIND, None), f"mount --bind {HOSTS}")
    finally:
        os.unlink(path)  # the bind mount keeps the file


def take_hostname(name: str) -> None:
    """Put this process, and what it starts, in UTS and mount namespaces of their own, with the
    host name ``name``, which resolves there (to OWN_ADDRESS).

    With CAP_SYS_ADMIN (root) the two namespaces are all it takes; otherwise they sit in a user
    namespace that maps this user and group to themselves, where the kernel lets users make one.
    Call it before any thread starts (a user namespace needs a process with a single thread).
    OSError where it does not work; a process left half-way must not go on (its ids may be
    unmapped), which is why the local backend tries it first in a child (``can_take_hostname``).
    """
    if len(name.encode()) > HOST_NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, f"{name!r} is longer than a host name may be ({HOST_NAME_MAX} bytes)")
    try:
        _unshare(CLONE_NEWUTS | CLONE_NEWNS)
    except PermissionError:
        uid, gid = os.geteuid(), os.getegid()
        _unshare(CLONE_NEWUSER | CLONE_NEWUTS | CLONE_NEWNS)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    socket.sethostname(name)
    _resolve_here(name)


def can_take_hostname(name: str = "mpilaunch-probe") -> str | None:
    """None where ``take_hostname(name)`` works on this machine, else why not. Tried in a forked
    child, which leaves this process as it was."""
    _libc()  # imported here, not in the child: another thread may hold the import lock
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(rfd)
            take_hostname(name)
            if socket.gethostbyname(name) != OWN_ADDRESS:
                raise OSError(errno.EADDRNOTAVAIL, f"{name} does not resolve to {OWN_ADDRESS} after all")
        except BaseException as exc:  # whatever it was, the parent is told
            os.write(wfd, str(exc).encode(errors="replace")[:500])
            code = EXIT_FAILED
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        why = r.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return why or f"the test ended with {os.waitstatus_to_exitcode(status)}"
