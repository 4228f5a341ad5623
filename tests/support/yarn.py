"""Helpers of the YARN tests (``tests/e2e/yarn``, and the cross-backend tests in
``tests/e2e`` that also run on the YARN testbed, the ``yarn`` fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from support.helpers import REPO, leftover_processes, python_stacks


def start(args, ctx, extra_env=None):
    """``mpilaunch --backend yarn`` with ``args`` and the testbed context ``ctx`` (the ``openmpi_env``
    fixture: its env and mpirun), started (stdout and stderr piped, text)."""
    cmd = [sys.executable, "-m", "mpilaunch", "--backend", "yarn", "--mpirun", ctx["mpirun"], *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**ctx["env"], **(extra_env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def app_by_name(yarn, name):
    """The newest application of that name (a reused cluster may hold older ones)."""
    apps = sorted((a for a in yarn.apps() if a["name"] == name), key=lambda a: a["startedTime"])
    assert apps, f"no application named {name}"
    return apps[-1]


def describe_app(yarn, name):
    """What the ResourceManager says of the application named ``name`` and of its nodes, and the
    tails of its containers' logs (the agents' sessions, the launcher's output): a diagnostic."""
    try:
        app = app_by_name(yarn, name)
    except AssertionError as e:  # none of that name
        return str(e)
    keys = ("id", "state", "finalStatus", "diagnostics", "runningContainers", "allocatedMB", "allocatedVCores")
    lines = [f"application: { ({k: app.get(k) for k in keys}) }"]
    lines += [f"container: {c.get('containerId')} on {c.get('assignedNodeId')}" for c in yarn.app_containers(app["id"])]
    lines += [
        f"node {n.get('id')}: {n.get('state')}, used {n.get('usedMemoryMB')} MB, free {n.get('availMemoryMB')} MB, "
        f"{n.get('numContainers')} containers"
        for n in yarn.nodes()
    ]
    return "\n".join(lines + [yarn.container_logs(app["id"]), python_stacks(container_processes(app["id"]))])


def container_processes(app_id: str) -> list[int]:
    """The processes of the application's containers on this machine (their CONTAINER_ID)."""
    prefix = "container_" + app_id[len("application_") :] + "_"
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("CONTAINER_ID", "").startswith(prefix):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def assert_released(yarn, name, final_status):
    app = yarn.wait_app(app_by_name(yarn, name)["id"], timeout=30)
    assert app["finalStatus"] == final_status, app
    # The RM learns that the NodeManagers ended the containers from their next
    # heartbeats, which can come a little after the application's final state.
    deadline = time.monotonic() + 15
    while yarn.app_containers(app["id"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert yarn.app_containers(app["id"]) == []
    deadline = time.monotonic() + 10
    while leftover_processes(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover_processes(name) == []

    # Nothing of this application is left on the NodeManagers either.
    def ours():
        return [pid for pid, cmd in yarn.leftover_processes().items() if app["id"].split("_", 1)[1] in proc_cwd(pid)]

    deadline = time.monotonic() + 10  # the RM may report the end before the NodeManager reaped everything
    while ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ours() == []
    return app


def proc_cwd(pid):
    """The working directory of process ``pid`` ("" when it is gone or not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def proc_cmdline(pid):
    """The raw (NUL-separated) command line of process ``pid`` (b"" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def proc_environ(pid):
    """The environment of process ``pid`` as a dict ({} when it is gone or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.split("=", 1) for item in f.read().decode(errors="replace").split("\0") if "=" in item)
    except OSError:
        return {}
