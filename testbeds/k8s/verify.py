"""Hand-run end-to-end check of the local Kubernetes testbed (not part of
the test suite): ``python -m testbeds.k8s.verify [--scale]``.

Starts a cluster, creates 16 nodes x 8 GPUs and checks scheduling, GPU
accounting, exec (output, exit code, stdin streaming, local process),
garbage collection, ServiceAccount tokens + RBAC, exec with a
ServiceAccount token, per-pod exec targets, and that stop() leaves no
process behind. ``--scale`` adds 256 pods and 256 concurrent execs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import subprocess
import sys
import time

from ..procs import pid_alive
from .binaries import MARKER_ENV, marked_pids
from .cluster import KubeCluster

FAILS: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)
    if not ok:
        FAILS.append(name)


def pod(name: str, gpus: int = 0, owner: dict | None = None, labels: dict | None = None) -> dict:
    c = {"name": "main", "image": "busybox", "command": ["sleep", "infinity"]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    meta: dict = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [c],
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", action="store_true", help="also 256 pods and 256 concurrent execs")
    args = ap.parse_args()

    t0 = time.monotonic()
    c = KubeCluster()
    c.start()
    marker = c.marker
    daemon_pid = None
    print(f"started in {time.monotonic() - t0:.1f}s: {c.server} ({c.workdir})", flush=True)
    try:
        t1 = time.monotonic()
        c.create_nodes(16, gpus=8)
        print(f"16 nodes Ready in {time.monotonic() - t1:.1f}s", flush=True)

        c.apply([pod("gpu-pod", gpus=8), pod("too-big", gpus=9)])
        c.wait_pods(selector=None, count=1, timeout=60)
        running = c.get_json("pod", "gpu-pod")
        check(
            "8-GPU pod Running on a kwok node",
            running["status"].get("phase") == "Running",
            f"node={running['spec'].get('nodeName')} ip={running['status'].get('podIP')}",
        )

        def failed_sched() -> str:
            ev = c.get_json("events", "--field-selector", "involvedObject.name=too-big")["items"]
            return " | ".join(e["message"] for e in ev if e["reason"] == "FailedScheduling")

        deadline = time.monotonic() + 30
        msg = ""
        while time.monotonic() < deadline and "Insufficient nvidia.com/gpu" not in msg:
            msg = failed_sched()
            time.sleep(0.5)
        check(
            "9-GPU pod Pending with Insufficient nvidia.com/gpu",
            c.get_json("pod", "too-big")["status"]["phase"] == "Pending" and "Insufficient nvidia.com/gpu" in msg,
            msg[:80],
        )

        r = c.kubectl(
            "exec",
            "gpu-pod",
            "--",
            "sh",
            "-c",
            f'echo hi; echo "$PPID $(pwd) $(id -u) ${MARKER_ENV}"; exit 3',
            check=False,
        )
        lines = r.stdout.splitlines()
        kwok_pid = c.pids["kwok"]
        check("exec prints and returns the exit code", r.returncode == 3 and lines[:1] == ["hi"], f"rc={r.returncode}")
        ppid, cwd, uid, mark = lines[1].split()
        check(
            "exec ran as a local child of kwok",
            int(ppid) == kwok_pid and cwd == str(c.exec_dir) and mark == marker,
            f"ppid={ppid} cwd={cwd} uid={uid}",
        )
        data = "".join(f"line {i}\n" for i in range(10000))
        r = c.kubectl("exec", "-i", "gpu-pod", "--", "cat", input=data, check=False)
        check(
            "exec -i streams stdin to EOF", r.returncode == 0 and r.stdout == data, f"{len(r.stdout)}/{len(data)} bytes"
        )

        c.kubectl("create", "configmap", "owner")
        uid_ = c.get_json("configmap", "owner")["metadata"]["uid"]
        c.apply(pod("owned", owner={"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid_}))
        c.wait_pods(selector=None, count=2, timeout=30)
        c.kubectl("delete", "configmap", "owner")
        gone = False
        for _ in range(60):
            if c.kubectl("get", "pod", "owned", check=False).returncode != 0:
                gone = True
                break
            time.sleep(0.5)
        check("owned pod garbage-collected after its owner is deleted", gone)

        c.kubectl("create", "namespace", "ns")
        c.kubectl("-n", "ns", "create", "serviceaccount", "sa")
        c.kubectl("-n", "default", "create", "role", "execer", "--verb=get,list", "--resource=pods")
        c.kubectl("-n", "default", "create", "role", "execer2", "--verb=create,get", "--resource=pods/exec")
        for role in ("execer", "execer2"):
            c.kubectl("-n", "default", "create", "rolebinding", role, f"--role={role}", "--serviceaccount=ns:sa")
        token = c.kubectl("-n", "ns", "create", "token", "sa", "--duration=10m").stdout.strip()
        as_sa = [
            c.kubectl_bin,
            "--kubeconfig=/dev/null",
            f"--server={c.server}",
            f"--certificate-authority={c.pki.ca_crt}",
            f"--token={token}",
        ]
        who = subprocess.run(as_sa + ["auth", "whoami", "-o", "json"], capture_output=True, text=True)
        user = json.loads(who.stdout)["status"]["userInfo"]["username"] if who.returncode == 0 else who.stderr
        check("ServiceAccount token (TokenRequest) authenticates", user == "system:serviceaccount:ns:sa", user)
        r = subprocess.run(as_sa + ["exec", "gpu-pod", "--", "sh", "-c", "exit 5"], capture_output=True, text=True)
        check("exec with the ServiceAccount token", r.returncode == 5, f"rc={r.returncode} {r.stderr.strip()[:60]}")
        r = subprocess.run(as_sa + ["delete", "pod", "gpu-pod"], capture_output=True, text=True)
        check(
            "RBAC denies what is not granted (delete pod)",
            r.returncode != 0 and "forbidden" in r.stderr,
            r.stderr.strip()[:90],
        )
        can = c.kubectl(
            "auth", "can-i", "create", "configmaps", "-n", "default", "--as=system:serviceaccount:ns:sa", check=False
        ).stdout.strip()
        check("auth can-i --as=SA denies create configmaps", can == "no", can)

        wd = c.workdir / "pod-gpu-pod"
        wd.mkdir()
        c.set_pod_exec("gpu-pod", workdir=str(wd), env={"POD_NAME": "gpu-pod"})
        ok = False
        for _ in range(40):  # kwok picks the Exec object up through a watch
            r = c.kubectl("exec", "gpu-pod", "--", "sh", "-c", "echo $(pwd) $POD_NAME", check=False)
            if r.stdout.split() == [str(wd), "gpu-pod"]:
                ok = True
                break
            time.sleep(0.25)
        check("per-pod Exec target (workDir/env)", ok, r.stdout.strip())

        r = c.kubectl(
            "exec", "gpu-pod", "--", "sh", "-c", "setsid sleep 1234 >/dev/null 2>&1 </dev/null & echo $!", check=False
        )
        daemon_pid = int(r.stdout.strip())

        if args.scale:
            t1 = time.monotonic()
            c.kubectl("create", "deployment", "w", "--image=busybox", "--replicas=256", "--", "sleep", "inf")
            pods = c.wait_pods(selector="app=w", count=256, timeout=300)
            check("256 pods Running", len(pods) >= 256, f"{time.monotonic() - t1:.1f}s")
            names = [p["metadata"]["name"] for p in pods][:256]
            t1 = time.monotonic()

            def one(n):
                return c.kubectl("exec", n, "--", "sh", "-c", f"echo {n}; exit 7", check=False, timeout=600)

            with cf.ThreadPoolExecutor(256) as ex:
                res = list(ex.map(one, names))
            good = sum(1 for n, r in zip(names, res) if r.returncode == 7 and r.stdout.strip() == n)
            check("256 concurrent execs", good == 256, f"{good}/256 ok in {time.monotonic() - t1:.1f}s")
    finally:
        t1 = time.monotonic()
        c.stop()
        print(f"stopped in {time.monotonic() - t1:.1f}s", flush=True)
    left = marked_pids(marker)
    alive = daemon_pid is not None and pid_alive(daemon_pid)  # a zombie (pid 1 not reaping) counts as gone
    check("nothing left behind after stop() (incl. a setsid'd exec child)", not left and not alive, f"left={left}")
    print(f"{len(FAILS)} failed" if FAILS else "all checks passed", f"in {time.monotonic() - t0:.1f}s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
