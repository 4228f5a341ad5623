"""The kubelet's part for agent pods on kwok nodes: run their container, end it when the pod goes.

kwok nodes have no kubelet and no container runtime: their pods are Running
and Ready at once, and nothing runs. That is enough for the exec transport
(kwok's ``Exec`` CRD runs exec'd commands on this machine) but not for
``--transport agent``, where each worker pod's main process is mpilaunch's
exec agent, listening on the pod IP. This runner watches the API server
and, for each pod on a kwok node whose container command starts the agent
(``mpilaunch.agent`` / ``mpilaunch-agent``), does what a kubelet does:

* runs the container's command on this machine, with the container's env
  (values and the downward API: pod name, namespace, IP), in its own mount
  and UTS namespaces: the pod's hostname, and its volumes at their mount
  paths (Secret and ConfigMap volumes as files with their modes, emptyDir
  as a private tmpfs: ``/dev/shm`` is the pod's own);
* the pod IP is a loopback address (each kwok node's pod CIDR is a
  127.65.I.0/24, ``cluster.create_nodes``), so the agent binds it as it
  would bind a real pod's;
* when the pod is deleted, SIGTERM to the container's process group, then
  SIGKILL after the pod's grace period, as the kubelet does.

A pod's TMPDIR and Open MPI's shared-memory directories are its own
directory under the runner's (``give_pods_their_env`` does the same for
exec'd commands): the pods share this machine's /tmp.

Everything else (scheduling, status, deletion) stays kwok's. Real pods on
the real node (``node.py``) are the kubelet's own and are never touched.

    python -m testbeds.k8s.pod_runner --kubeconfig K --workdir DIR
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

AGENT_MARKS = ("mpilaunch.agent", "mpilaunch-agent")
KWOK_PODS = ipaddress.ip_network("127.65.0.0/16")  # cluster.create_nodes: node I has 127.65.I.0/24


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} pod-runner: {message}", file=sys.stderr, flush=True)


def runs_agent(container: dict) -> bool:
    words = " ".join((container.get("command") or []) + (container.get("args") or []))
    return any(mark in words for mark in AGENT_MARKS)


def on_kwok_node(pod: dict) -> bool:
    ip = (pod.get("status") or {}).get("podIP")
    try:
        return bool(ip) and ipaddress.ip_address(ip) in KWOK_PODS
    except ValueError:
        return False


def field_value(pod: dict, path: str) -> str:
    meta, status = pod["metadata"], pod.get("status") or {}
    return {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "status.podIP": status.get("podIP") or "",
        "spec.nodeName": pod["spec"].get("nodeName") or "",
        "status.hostIP": status.get("hostIP") or "",
    }.get(path, "")


def container_env(pod: dict, container: dict, base: dict) -> dict:
    env = dict(base)
    for item in container.get("env") or ():
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[item["name"]] = field_value(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
    return env


class PodRunner:
    def __init__(self, kubeconfig: str, workdir: Path):
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.workdir = workdir
        self.running: dict[str, subprocess.Popen] = {}  # pod uid -> its container's process
        self.by_ip: dict[str, subprocess.Popen] = {}  # pod IP -> the process of the pod that has it
        self.lock = threading.Lock()

    # ------------------------------------------------------------ volumes

    def _volume_files(self, namespace: str, volume: dict) -> tuple[dict[str, bytes], int] | None:
        """The files of a Secret or ConfigMap volume and their mode; None for other kinds."""
        if "secret" in volume:
            source = volume["secret"]
            obj = self.api.read_namespaced_secret(source["secretName"], namespace)
            files = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        elif "configMap" in volume:
            source = volume["configMap"]
            obj = self.api.read_namespaced_config_map(source["name"], namespace)
            files = {k: v.encode() for k, v in (obj.data or {}).items()}
            files.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        else:
            return None
        return files, int(source.get("defaultMode", 0o644))

    def _mount_script(self, pod: dict, container: dict, poddir: Path) -> list[str]:
        """Shell lines, run in the pod's new mount namespace, that put its volumes in place."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
        lines = []
        for mount in container.get("volumeMounts") or ():
            volume = volumes.get(mount["name"])
            if volume is None:
                continue
            target = mount["mountPath"]
            Path(target).mkdir(parents=True, exist_ok=True)  # an empty mount point on this machine
            if "emptyDir" in volume:
                if self.workdir.resolve().is_relative_to(Path(target).resolve()):
                    # a pod's scratch at /tmp: a tmpfs there would hide this runner's files (the other
                    # volumes' sources); the pod's own directory stands in for it (start: HOME, TMPDIR)
                    continue
                lines.append(f"mount -t tmpfs -o mode=1777 tmpfs {shlex.quote(target)}")
                continue
            made = self._volume_files(pod["metadata"]["namespace"], volume)
            if made is None:
                continue
            files, mode = made
            source = poddir / "volumes" / mount["name"]
            source.mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                path = source / name
                path.write_bytes(data)
                path.chmod(mode)
            lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}")
        return lines

    # ------------------------------------------------------------ containers

    def _free_ip(self, ip: str) -> None:
        """kwok gives a deleted pod's IP to the next pod at once; a real node frees it only with the old
        pod's sandbox, its processes gone. So: end whatever of a deleted pod still holds ``ip`` (seen:
        a new job's shims reached the old job's agent, still exiting, and were refused)."""
        old = self.by_ip.pop(ip, None)
        if old is not None and old.poll() is None:
            try:
                os.killpg(old.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            old.wait()

    def start(self, pod: dict) -> None:
        meta = pod["metadata"]
        ip = pod["status"]["podIP"]
        self._free_ip(ip)
        container = pod["spec"]["containers"][0]
        poddir = self.workdir / meta["namespace"] / meta["name"] / meta["uid"]
        (poddir / "tmp").mkdir(parents=True, exist_ok=True)
        own = str(poddir / "tmp")
        env = container_env(
            pod,
            container,
            {
                **os.environ,
                "HOSTNAME": pod["spec"].get("hostname") or meta["name"],
                "TMPDIR": own,
                "OMPI_MCA_btl_vader_backing_directory": own,
                "OMPI_MCA_btl_sm_backing_directory": own,
            },
        )
        covering = {
            m["mountPath"]
            for m in container.get("volumeMounts") or ()
            if self.workdir.resolve().is_relative_to(Path(m["mountPath"]).resolve())
        }
        env.update({k: own for k, v in env.items() if k in ("HOME", "TMPDIR") and v in covering})
        setup = self._mount_script(pod, container, poddir)
        setup.append(f"hostname {shlex.quote(env['HOSTNAME'])}")
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        script = " && ".join(setup) + ' && exec "$@"'
        log_file = open(poddir / "container.log", "ab")
        proc = subprocess.Popen(
            ["unshare", "--mount", "--uts", "--propagation", "private", "/bin/sh", "-c", script, "pod", *argv],
            env=env,
            cwd=container.get("workingDir") or os.getcwd(),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log_file.close()
        self.running[meta["uid"]] = proc
        self.by_ip[ip] = proc
        log(f"started {meta['namespace']}/{meta['name']} ({(pod.get('status') or {}).get('podIP')}): pid {proc.pid}")

    def stop(self, uid: str, name: str, grace: float) -> None:
        proc = self.running.pop(uid, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

            def kill_later():
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                log(f"stopped {name}: exit {proc.returncode}")

            threading.Thread(target=kill_later, daemon=True).start()

    def handle(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        uid, name = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        containers = pod["spec"].get("containers") or []
        if not containers or not runs_agent(containers[0]):
            return
        with self.lock:
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                grace = meta.get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                self.stop(uid, name, float(grace))
            elif uid not in self.running and on_kwok_node(pod):
                try:
                    self.start(pod)
                except Exception as e:  # one pod's failure is not the runner's
                    log(f"cannot start {name}: {e}")

    def serve(self) -> None:
        from kubernetes import watch

        while True:
            try:
                stream = watch.Watch().stream(
                    self.api.list_pod_for_all_namespaces, timeout_seconds=300, _preload_content=False
                )
                for event in stream:
                    self.handle(event["type"], event["raw_object"])
            except Exception as e:  # the API server restarting: watch again (handle is idempotent)
                log(f"watch ended ({e}); watching again")
                time.sleep(0.5)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbeds.k8s.pod_runner")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    runner = PodRunner(args.kubeconfig, args.workdir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log("watching pods")
    try:
        runner.serve()
    finally:
        for uid, proc in list(runner.running.items()):
            runner.stop(uid, uid, 1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
