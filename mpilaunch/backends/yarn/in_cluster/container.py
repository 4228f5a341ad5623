"""Inside each YARN worker container: ``python -m mpilaunch.backends.yarn.in_cluster.container``.

The container's whole job is to host one ``mpilaunch agent``:

1. read the job secret from skein's key-value store (mutual TLS with the
   ApplicationMaster, using the credentials skein localized into the
   container), so it never appears on a command line, in the container's
   environment or in ``launch_container.sh``;
2. find the GPUs this container may use and give them to the agent as
   ``CUDA_VISIBLE_DEVICES`` (physical device ids -> logical 0..N-1 in CUDA);
3. start the agent (secret on its stdin), then publish the agent's address in
   the key-value store for the launcher;
4. stay as the agent's parent, a child subreaper: when the agent ends, for
   any reason, kill whatever of its sessions is left (daemonized orted/prted
   are re-parented here if the agent was killed) and exit with its code, so
   YARN sees the container end.

With ``--env-archive`` this module, the agent and every rank wrapper run
from mpilaunch's pieces localized with the job, under the archive's python
(``tools.py``).

Environment set by the launcher (skein service env): MPILAUNCH_YARN_JOB,
MPILAUNCH_YARN_GPUS (GPUs allocated to the container), MPILAUNCH_YARN_KV
(key prefix). YARN/skein add CONTAINER_ID, NM_HOST, NM_HTTP_PORT and
SKEIN_CONTAINER_ID (``worker_<instance>``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET

from ....core import env_names
from ....core.exit_codes import EXIT_FAILED
from ..keys import GPU_KEY, WORKER_KEY, WORKER_SECRET_KEY
from ..kv_poll import wait_key

PR_SET_CHILD_SUBREAPER = 36


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} mpilaunch-yarn-container: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ GPUs


def nm_assigned_gpus(container_id: str) -> list[str] | None:
    """Device indices the NodeManager's GPU plugin assigned to this container.

    Only NodeManagers that isolate GPUs (LinuxContainerExecutor) record
    assignments; with the DefaultContainerExecutor the list is empty.
    """
    host, port = os.environ.get("NM_HOST"), os.environ.get("NM_HTTP_PORT")
    if not host or not port:
        return None
    url = f"http://{host}:{port}/ws/v1/node/resources/yarn.io%2Fgpu"
    try:
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            info = json.load(resp)
    except (OSError, ValueError):
        return None
    assigned = info.get("assignedGpuDevices") or []
    mine = [str(d.get("index")) for d in assigned if d.get("containerId") == container_id]
    return mine or None


def nvidia_smi_gpus() -> list[str]:
    """Physical GPU indices from ``nvidia-smi -q -x`` (index = order of the <gpu> elements)."""
    try:
        out = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, timeout=30, check=True).stdout
        root = ET.fromstring(out)
    except (OSError, subprocess.SubprocessError, ET.ParseError):
        return []
    return [str(i) for i, _ in enumerate(root.findall("gpu"))]


def claim_gpus(kv, prefix: str, count: int, container_id: str) -> list[str]:
    """Without an NM assignment: take ``count`` of the node's GPUs no sibling container took.

    The claim is an atomic setdefault in the key-value store, so two workers of
    this job on one node get disjoint GPUs (other applications are not seen).
    """
    node = f"{os.environ.get('NM_HOST', 'node')}:{os.environ.get('NM_PORT', '')}"
    mine = []
    for index in nvidia_smi_gpus():
        if len(mine) == count:
            break
        owner = kv.setdefault(f"{prefix}{GPU_KEY}{node}/{index}", container_id.encode())
        if owner == container_id.encode():
            mine.append(index)
    return mine


def container_gpus(kv, prefix: str, count: int, container_id: str) -> tuple[list[str], str]:
    """The GPUs this container may use, and where that answer came from."""
    if count <= 0:
        return [], "none requested"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # a runtime (Docker) already isolated them
        return [d for d in visible.split(",") if d][:count], "CUDA_VISIBLE_DEVICES"
    assigned = nm_assigned_gpus(container_id)
    if assigned:
        return assigned[:count], "NodeManager assignment"
    return claim_gpus(kv, prefix, count, container_id), "nvidia-smi"


# ------------------------------------------------------------------ agent


def worker_name(job: str) -> str:
    if os.environ.get(env_names.YARN_WORKER_NAME):  # a replacement (--retries): set by add_container
        return os.environ[env_names.YARN_WORKER_NAME]
    service, _, instance = os.environ["SKEIN_CONTAINER_ID"].rpartition("_")
    names = os.environ.get(env_names.YARN_WORKER_NAMES, "").split(",")
    if names != [""] and int(instance) < len(names):
        return names[int(instance)]
    return f"{job}-{service}-{int(instance)}"


def advertise_host() -> str:
    import socket

    return os.environ.get("NM_HOST") or socket.getfqdn()


def start_agent(name: str, secret: bytes, devices: list[str] | None, container_id: str):
    addr_file = os.path.abspath("mpilaunch-agent.addr")
    from ..tools import module_argv

    argv = module_argv("mpilaunch.agent") + [
        "--name",
        name,
        "--listen",
        "0.0.0.0:0",
        "--advertise",
        advertise_host(),
        "--address-file",
        addr_file,
        "--secret-stdin",
        "--exit-with-pid",
        str(os.getpid()),
        "--env",
        f"{env_names.YARN_CONTAINER}={container_id}",
    ]
    if devices is not None:
        argv += ["--env", "CUDA_VISIBLE_DEVICES=" + ",".join(devices)]
    agent = subprocess.Popen(argv, stdin=subprocess.PIPE)
    agent.stdin.write(secret + b"\n")
    agent.stdin.close()
    return agent, wait_address(agent, addr_file)


#: how long the agent may take to listen and write its address: its interpreter's start from a
#: localized env archive on a loaded node takes seconds; one that takes minutes is stuck (a hung
#: filesystem), and the launcher would otherwise wait for this worker until its --start-timeout
#: with nothing to say why
AGENT_ADDRESS_TIMEOUT_S = 120.0


def wait_address(agent: subprocess.Popen, addr_file: str) -> str:
    """The address the agent wrote to ``addr_file``; SystemExit (the container ends, its log says
    why) when the agent exits first or writes none within AGENT_ADDRESS_TIMEOUT_S (it is killed)."""
    deadline = time.monotonic() + AGENT_ADDRESS_TIMEOUT_S
    while not os.path.exists(addr_file):
        if agent.poll() is not None:
            raise SystemExit(f"agent exited with code {agent.returncode} before listening")
        if time.monotonic() > deadline:
            agent.kill()
            try:
                agent.wait(10)  # not forever either: one stuck in the kernel outlives SIGKILL
            except subprocess.TimeoutExpired:
                pass
            raise SystemExit(
                f"agent (pid {agent.pid}) wrote no address in {AGENT_ADDRESS_TIMEOUT_S:g} s: stopped it "
                "(its log is above; a hung filesystem under the env archive or the container's work directory?)"
            )
        time.sleep(0.02)
    with open(addr_file) as f:
        return f.read().strip()


def _descendants() -> list[int]:
    me = os.getpid()
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [me]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        found += kids
        todo += kids
    return found


def sweep_descendants(grace: float = 0.5) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _descendants()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                break
            if not _descendants():
                break
            time.sleep(0.05)


def remove_agent_tmp(name: str, since: float) -> None:
    """The agent's private TMPDIR, which a SIGKILLed agent (YARN's stop) leaves behind."""
    import glob
    import shutil
    import tempfile

    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"mpilaunch-{name}-*")):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_ctime >= since - 1:
            shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    import skein

    job = os.environ[env_names.YARN_JOB]
    prefix = os.environ.get(env_names.YARN_KV, "mpilaunch/")
    container_id = os.environ.get("CONTAINER_ID", "")
    name = worker_name(job)
    gpus = int(os.environ.get(env_names.YARN_GPUS, "0") or 0)

    started = time.time()
    app = skein.ApplicationClient.from_current()
    secret = wait_key(app.kv, prefix + WORKER_SECRET_KEY)
    devices, source = container_gpus(app.kv, prefix, gpus, container_id)
    if gpus and len(devices) < gpus:
        log(f"warning: {gpus} GPUs allocated but only {len(devices)} found ({source})")
    agent, address = start_agent(name, secret, devices if gpus else None, container_id)
    del secret
    app.kv[prefix + WORKER_KEY + name] = json.dumps(
        {
            "address": address,
            "container": container_id,
            "host": advertise_host(),
            "gpus": devices,
            "gpu_source": source,
            "pid": agent.pid,
        }
    ).encode()
    log(f"worker {name} in {container_id}: agent {address}, GPUs {','.join(devices) or '-'} ({source})")
    app.close()

    # YARN stops a container with SIGTERM to its process group (the agent gets
    # it too and ends its sessions); here it only means "wait for the agent".
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    code = agent.wait()
    sweep_descendants()
    remove_agent_tmp(name, started)
    log(f"agent exited with code {code}")
    return code if code > 0 else 1  # a worker never ends on its own: any end is a failure


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as e:
        log(f"error: {e.code}")
        code = EXIT_FAILED
    except Exception as e:
        log(f"error: {e!r}")
        code = EXIT_FAILED
    sys.stderr.flush()
    # skein's gRPC/kv threads can keep a normal interpreter exit waiting, and
    # YARN only sees the container end when this process is gone.
    os._exit(code)
