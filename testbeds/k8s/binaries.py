"""The control plane's binaries (``build.sh``, cached) and the processes the testbed starts (marked, swept).

Stdlib only.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..procs import pid_alive
from .common import ClusterError, cache_dir

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"

K8S_VERSION = os.environ.get("K8S_VERSION", "v1.33.13")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.5.21")
KWOK_VERSION = os.environ.get("KWOK_VERSION", "v0.8.0")

#: annotation / label / taint key kwok uses for the nodes it manages
KWOK_NODE_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
#: every process this module starts (and everything kwok execs) carries this
#: variable in its environment; ``stop()`` sweeps /proc for it
MARKER_ENV = "MPILAUNCH_TESTBED_K8S"

# --------------------------------------------------------------------------
# build


def kwok_binary_name() -> str:
    import hashlib

    patch = HERE / f"kwok-{KWOK_VERSION}-exec.patch"
    pid = hashlib.sha256(patch.read_bytes()).hexdigest()[:8]
    return f"kwok-{KWOK_VERSION}-p{pid}"


def binary_names() -> dict[str, str]:
    names = {
        c: f"{c}-{K8S_VERSION}"
        for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
    }
    names["etcd"] = f"etcd-{ETCD_VERSION}"
    names["kwok"] = kwok_binary_name()
    return names


def ensure_built(quiet: bool = False) -> Path:
    """Build (or find cached) binaries; return the bin directory."""
    bindir = cache_dir() / "bin"
    share = cache_dir() / "share" / f"kwok-{KWOK_VERSION}" / ".complete"
    missing = [n for n in binary_names().values() if not os.access(bindir / n, os.X_OK)]
    if missing or not share.exists():
        if not quiet:
            print(f"[k8s] building {', '.join(missing) or 'kwok data'} via {BUILD_SH}", file=sys.stderr)
        out = subprocess.DEVNULL if quiet else None
        subprocess.run(["bash", str(BUILD_SH)], check=True, stdout=out)
    return bindir


# --------------------------------------------------------------------------
# helpers


def run_tool(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    try:
        return subprocess.run([str(c) for c in cmd], **kw)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"{' '.join(map(str, cmd))} failed ({e.returncode}): {e.stderr}") from e


def b64_file(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def marked_pids(marker: str) -> list[int]:
    """Pids of processes whose environment carries MARKER_ENV=marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(d))
    return out


def kill_all(pgids: list[int], marker: str | None, timeout: float = 10.0) -> None:
    """SIGTERM the process groups, then anything carrying the marker; SIGKILL
    what is left after `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pg in pgids:
            try:
                os.killpg(pg, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if marker:
            for pid in marked_pids(marker):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            alive = [pg for pg in pgids if pid_alive(pg)]
            if marker:
                alive += [p for p in marked_pids(marker) if pid_alive(p)]
            if not alive:
                return
            time.sleep(0.1)
