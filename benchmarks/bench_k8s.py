"""Kubernetes exec launch cost: mpilaunch's transport vs one ``kubectl exec`` per daemon.

    python benchmarks/bench_k8s.py [--pods 256] [--sizes 16 32 64] [--repeat 3] [--workdir DIR]

Starts the Kubernetes testbed (testbeds/k8s: real kube-apiserver, scheduler,
controller-manager, etcd; kwok nodes whose exec runs local processes), or
attaches to a cluster started with ``python -m testbeds.k8s.cluster up
--workdir DIR``, creates ``--pods`` sleeping pods, and measures, in the same
run and with the same admin credentials:

(a) exec fan-out: ``--pods`` concurrent rsh-agent invocations of a trivial
    command (``echo ok-<pod>``), one per pod, through
    * ``mpilaunch-rsh`` (the per-job ``-IS`` launcher mpilaunch writes) with
      the job's exec relay (the default: the shim passes its descriptors to
      one relay process that holds the TLS setup; the relay's CPU is counted),
    * ``mpilaunch-rsh`` with ``MPILAUNCH_K8S_RELAY=0`` (stdlib websocket
      client, one TLS connection per shim), and
    * the baseline: the Kubeflow MPI operator v1 ``kubexec.sh`` —
      ``/bin/sh`` script that runs ``kubectl exec POD -- /bin/sh -c "$*"``.
    Wall time until all finish, and launcher CPU-seconds (user+sys of the
    agent processes and everything they started on the launcher side,
    ``RUSAGE_CHILDREN``; the exec'd command itself runs under kwok, not here).
(b) full ``mpirun`` launches of ``true`` over N one-slot pods (Open MPI 5,
    the mpirun argv ``mpi.build_mpirun`` makes): mpilaunch's transport vs the
    kubexec.sh baseline vs the ``/bin/sh`` agent floor (no exec channel at
    all, benchmarks/floor.py). Larger N only count if the floor completes.

Prints Markdown: (a) the median over ``--repeat`` alternating runs, (b) every
run, with the load average (1/5/15 min) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from floor import write_sh_agent  # noqa: E402

from mpilaunch.backends.k8s.launch import TRANSPORT  # noqa: E402
from mpilaunch.core import hostfile, mpi  # noqa: E402
from mpilaunch.rsh_agent.shim import write_launcher  # noqa: E402

# Kubeflow MPI operator v1's ConfigMap script, pointed at the testbed's kubectl.
KUBEXEC = """#!/bin/sh
POD_NAME=$1
shift
exec {kubectl} exec ${{POD_NAME}} -- /bin/sh -c "$*"
"""


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def make_pods(cluster, count: int, label: str, work: Path) -> list[str]:
    """``count`` Running pods, each with what a real pod has and kwok's exec
    lacks: its own TMPDIR (PRRTE's session directories are named by pid, and
    one left by a killed run would meet a later daemon with the same pid)."""
    names = [f"{label}-{i}" for i in range(count)]
    for n in names:
        (work / "pods" / n).mkdir(parents=True)
    cluster.apply([cluster.pod_exec(n, env={"TMPDIR": str(work / "pods" / n)}) for n in names])
    items = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": n, "labels": {"bench": label}},
            "spec": {"nodeSelector": {"type": "kwok"}, "containers": [{"name": "worker", "image": "bench"}]},
        }
        for n in names
    ]
    cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    cluster.wait_pods(selector=f"bench={label}", count=count, timeout=300)
    return names


def forget_pods(cluster, label: str, count: int) -> None:
    cluster.kubectl("delete", "pods", "-l", f"bench={label}", "--wait=false", check=False)
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=false", *[f"exec/{label}-{i}" for i in range(count)], check=False
    )


def fanout(
    agent_argv: list[str], pods: list[str], env: dict, relay_context: dict | None = None, work: Path | None = None
) -> dict:
    """Start one agent per pod at once; wall time until all ended, their CPU.

    With ``relay_context`` the job's exec relay is started first (not timed:
    it is job set-up, done once) and stopped and waited for at the end, so
    all of its CPU, start-up included, is counted.
    """
    cpu0 = cpu_children()
    relay = None
    if relay_context is not None:
        from mpilaunch.backends.k8s.exec_path import relay as k8s_relay

        # started before the clock (job set-up, once per job), its CPU counted
        relay, path = k8s_relay.start(relay_context, work)
        ctx = {**relay_context, "relay": path}
        (work / "context-relay.json").write_text(json.dumps(ctx))
        env = {**env, "MPILAUNCH_CONTEXT": str(work / "context-relay.json")}
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            agent_argv + [pod, f"echo ok-{pod}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for pod in pods
    ]
    results = [(p.communicate(timeout=600), p.returncode) for p in procs]
    wall = time.monotonic() - t0
    if relay is not None:
        from mpilaunch.backends.k8s.exec_path import relay as k8s_relay

        k8s_relay.stop(relay)
    cpu = cpu_children() - cpu0
    ok = sum(1 for (out, _err), rc in results if rc == 0 and out.decode().strip().startswith("ok-"))
    errors = [err.decode()[-200:] for (_out, err), rc in results if rc != 0][:3]
    return {"wall_s": wall, "cpu_s": cpu, "ok": ok, "errors": errors}


def mpirun_launch(info, agent: str, hosts: list[str], workdir: Path, env: dict, timeout: float) -> float | str:
    """Seconds until mpirun exited 0, else "stall" (still running after ``timeout``) or "failed"."""
    hf = workdir / f"hostfile-{len(hosts)}"
    hf.write_text(hostfile.render([(h, 1) for h in hosts], info.hostfile_flavour))
    command = mpi.build_mpirun(
        info,
        ranks=len(hosts),
        hosts=len(hosts),
        hostfile=str(hf),
        shim=agent,
        command=["true"],
        environ=dict(env),
        as_root=os.geteuid() == 0,
    )
    # mpirun's session directory in this run's own TMPDIR: one that a killed
    # mpirun left in /tmp makes a later mpirun with the same pid fail at once
    # ("The PMIx server's listener thread failed to start"; pids wrap here).
    tmp = workdir / "mpirun-tmp"
    tmp.mkdir(exist_ok=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command.argv,
        env={**env, **command.env, "TMPDIR": str(tmp)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        kill_daemons(workdir)
        return "stall"
    if proc.returncode != 0:
        print(f"  mpirun via {Path(agent).name} over {len(hosts)} failed: {err.decode()[-300:]}", file=sys.stderr)
        return "failed"
    return time.monotonic() - t0


def kill_daemons(workdir: Path) -> None:
    """A stalled launch leaves daemonized prted behind (outside mpirun's group, and
    under kwok for the exec paths); each names this run's hostfile, so end exactly those."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if str(workdir).encode() in cmdline and b"prted" in cmdline:  # not the relay
                os.kill(int(entry), 9)
        except (OSError, ProcessLookupError):
            continue


def median(values):
    values = [v for v in values if isinstance(v, float)]
    return statistics.median(values) if values else None


def fmt(v, unit="s"):
    if isinstance(v, str):
        return v
    return "stalled/failed" if v is None else f"{v:.2f} {unit}".strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=256)
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", help="attach to a running testbed (cluster up --workdir DIR)")
    ap.add_argument("--mpirun-timeout", type=float, default=30)
    args = ap.parse_args(argv)

    from testbeds.k8s.cluster import KubeCluster

    own = None
    if args.workdir:
        state = json.loads(Path(args.workdir, "cluster.json").read_text())
        cluster = KubeCluster.__new__(KubeCluster)
        cluster.kubeconfig, cluster.kubectl_bin = Path(state["kubeconfig"]), state["kubectl"]
        cluster.server, cluster._procs = state["server"], {}
        cluster.workdir = Path(args.workdir)
        cluster.marker, cluster.exec_dir = state["marker"], Path(state["exec_dir"])
    else:
        own = cluster = KubeCluster()
        cluster.start()
        cluster.create_nodes(16, gpus=8)
    work = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    label = f"bench{os.getpid()}"
    try:
        t0 = time.monotonic()
        pods = make_pods(cluster, args.pods, label, work)
        print(f"# {len(pods)} pods Running in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}

        # mpilaunch's side: credentials flattened once, as the backend does for --launcher local
        from mpilaunch.backends.k8s.api import resolve

        creds = resolve(str(cluster.kubeconfig), None, "default", work)
        context = {"transport": TRANSPORT, **creds, "container": "worker", "workers": {p: {"pod": p} for p in pods}}
        (work / "context.json").write_text(json.dumps(context))
        shim = write_launcher(str(work / "mpilaunch-rsh"))
        shim_env = {**env, "MPILAUNCH_CONTEXT": str(work / "context.json")}
        kubexec = work / "kubexec.sh"
        kubexec.write_text(KUBEXEC.format(kubectl=cluster.kubectl_bin))
        kubexec.chmod(0o755)

        # (a) fan-out
        runs = {"mpilaunch": [], "direct": [], "kubectl": []}
        for i in range(args.repeat):
            for name, argv_, e, rc in (
                ("mpilaunch", [shim], shim_env, context),
                ("direct", [shim], shim_env, None),
                ("kubectl", [str(kubexec)], env, None),
            ):
                r = fanout(argv_, pods, e, rc, work)
                runs[name].append(r)
                print(
                    f"# fan-out {name} run {i}: {r['ok']}/{len(pods)} ok, wall {r['wall_s']:.2f}s, "
                    f"cpu {r['cpu_s']:.2f}s {r['errors'] or ''}",
                    file=sys.stderr,
                )
        # (b) full mpirun launches
        info = mpi.find_mpirun("auto", None, env.get("PATH"))
        floor_agent = write_sh_agent(work)
        from mpilaunch.backends.k8s.exec_path import relay as k8s_relay

        relay, relay_path = k8s_relay.start(context, work)
        (work / "context-relay.json").write_text(json.dumps({**context, "relay": relay_path}))
        shim_env = {**env, "MPILAUNCH_CONTEXT": str(work / "context-relay.json")}
        launches: dict[int, dict[str, list]] = {}
        load = [" / ".join(f"{x:.1f}" for x in os.getloadavg())]
        for n in args.sizes:
            launches[n] = {"floor": [], "mpilaunch": [], "kubectl": []}
            for i in range(args.repeat):
                for name, agent, e in (
                    ("floor", floor_agent, env),
                    ("mpilaunch", shim, shim_env),
                    ("kubectl", str(kubexec), env),
                ):
                    hosts = pods[:n] if name != "floor" else [f"floor-worker-{j}" for j in range(n)]
                    t = mpirun_launch(info, agent, hosts, work, e, args.mpirun_timeout)
                    launches[n][name].append(t)
                    print(f"# mpirun true N={n} {name} run {i}: {fmt(t)}", file=sys.stderr)
        k8s_relay.stop(relay)
        load.append(" / ".join(f"{x:.1f}" for x in os.getloadavg()))
    finally:
        forget_pods(cluster, label, args.pods)
        if own is not None:
            own.stop()
        shutil.rmtree(work, ignore_errors=True)

    k = runs["kubectl"]
    kw, kc = median([r["wall_s"] for r in k]), median([r["cpu_s"] for r in k])
    print(
        f"\n(a) exec fan-out: {args.pods} concurrent agent invocations (`echo ok-<pod>`), one per kwok pod, "
        f"median of {args.repeat}\n"
    )
    print(
        "| agent | completed (worst run) | wall | launcher CPU | CPU per invocation | wall vs baseline | CPU vs baseline |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    labels = {
        "mpilaunch": "mpilaunch-rsh + job relay (default)",
        "direct": "mpilaunch-rsh, own TLS connection each",
        "kubectl": "kubexec.sh + `kubectl exec` (MPI operator v1)",
    }
    for name in ("mpilaunch", "direct", "kubectl"):
        r = runs[name]
        w, c = median([x["wall_s"] for x in r]), median([x["cpu_s"] for x in r])
        print(
            f"| {labels[name]} | {min(x['ok'] for x in r)}/{args.pods} | {fmt(w)} | {fmt(c)} | "
            f"{c / args.pods * 1000:.0f} ms | {w / kw:.2f}x | {c / kc:.2f}x |"
        )
    print(
        f"\n(b) `mpirun true` over N one-slot pods (Open MPI {info.version}, no tree spawn), every run "
        f"(stall: not done within {args.mpirun_timeout:g} s); load average {load[0]} before, {load[1]} after\n"
    )
    print(
        "| N | /bin/sh agent floor | mpilaunch-rsh + relay | kubexec.sh + kubectl | completed | median mpilaunch / kubectl |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for n, r in launches.items():
        runs_ = {x: ", ".join(v if isinstance(v, str) else f"{v:.2f}" for v in r[x]) + " s" for x in r}
        done = " / ".join(
            f"{sum(isinstance(v, float) for v in r[x])}/{len(r[x])}" for x in ("floor", "mpilaunch", "kubectl")
        )
        m_, k_ = median(r["mpilaunch"]), median(r["kubectl"])
        ratio = f"{m_ / k_:.2f}x" if m_ and k_ else "-"
        print(f"| {n} | {runs_['floor']} | {runs_['mpilaunch']} | {runs_['kubectl']} | {done} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
