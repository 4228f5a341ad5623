"""mpilaunch against Kubeflow's mpi-operator, the same job on the same real node (issue 53).

    python benchmarks/bench_vs_mpi_operator.py [--shapes 2x2 8x1] [--repeat 5] [--workdir DIR]
        [--json FILE] [--no-tenant] [--no-ompi5]

Starts the Kubernetes testbed's real node (or attaches with ``--workdir`` to one
from ``cluster up --real-node``), builds and starts the peer
(``testbeds/k8s/mpi_operator.py``: the controller v0.8.2 from its Go module
source, cached) and runs one job three ways, interleaved (each round starts with
the next system), ``--repeat`` times per shape:

* ``mpi-operator``: a kubeflow.org/v2beta1 MPIJob as the operator's own examples
  write one: a launcher pod runs ``mpirun`` and reaches each worker's sshd
  (``kubectl apply``, then nothing more from the user);
* ``mpilaunch cluster``: ``--launcher cluster`` (mpirun in a launcher pod);
* ``mpilaunch local``: ``--launcher local`` (mpirun here, this machine's Open MPI 4.1).

The job: ``WORKERSxSLOTS`` ranks of tests/programs/placement.py (an allreduce,
then one JSON line saying where the rank ran), all three in ``foreign-mpiop``
(Debian bookworm's Open MPI 4.1 + mpi4py + sshd for mpiuser; mpilaunch brings
its pieces in the job's ConfigMap, as for any foreign image).

Per run, seconds from the submit (the ``kubectl apply`` / mpilaunch's start):
``workers`` every worker pod Running (one pod watch, the same for all three);
``first`` the first rank line (mpilaunch: its stdout; the operator: the
launcher container's log line, by the timestamp containerd wrote it, which no
user sees sooner); ``exit`` mpilaunch's exit / the MPIJob's Succeeded condition
(what ``kubectl wait --for=condition=Succeeded`` returns on); ``released`` no
pod of the job holds a container (mpilaunch: every pod deleted; the operator,
``cleanPodPolicy: Running``: workers deleted, launcher Completed. Its Job,
Service, ConfigMap and Secret stay until the user deletes the MPIJob, as a user
of it must: that deletion is not timed). ``requests``: kube-apiserver's
``apiserver_request_total`` over the run (from the submit to 2 s after
release: everyone's, the kubelet's and controllers' included, less the rate
measured idle with every component up); ``launcher cpu``: CPU seconds of the
launcher pod's container (cgroup ``cpuacct.usage``, sampled every 50 ms while
it runs) or, ``--launcher local``, of mpilaunch and its children here;
``client cpu``: the submitting process (mpilaunch / kubectl apply);
``controller cpu``: the mpi-operator process over the run. ``placed``: every
rank ran in the worker pod the plan says (rank r on worker r // slots).

Then, once each: the same job by an ``edit``-only tenant in a namespace that
enforces PodSecurity ``restricted`` (tests/support/tenant.py's namespace), and
under Open MPI 5 (``foreign-mpiop5``, Debian trixie: does each rank run where the
plan says? mpi-operator issue #842).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from bench_real_pods import MPIRUN, fmt, load, median  # noqa: E402

SYSTEMS = ["mpi-operator", "mpilaunch cluster", "mpilaunch local"]
MUTATING = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}


def json_stream(lines):
    """The objects of a ``kubectl get --watch -o json`` output (pretty-printed, one after another)."""
    decoder, buf = json.JSONDecoder(), ""
    for line in lines:
        buf += line
        try:
            obj, end = decoder.raw_decode(buf.lstrip())
        except ValueError:
            continue
        buf = buf.lstrip()[end:]
        yield obj


class PodWatch:
    """One ``kubectl get pods --watch`` of a namespace: when the job's workers all ran, when
    none of its pods held a container any more, and its launcher container's CPU (sampled)."""

    def __init__(self, cluster, job: str, workers: int, namespace: str = "default"):
        self.job, self.workers, self.t0 = job, workers, time.monotonic()
        self.pods: dict[str, dict] = {}
        self.at: dict[str, float] = {}
        self.launcher_cpu = 0.0
        self.launcher_cgroup: Path | None = None
        self.proc = subprocess.Popen(
            [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "get", "pods", "-n", namespace]
            + ["--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        for event in json_stream(self.proc.stdout):
            self._event(event["type"], event["object"], time.monotonic() - self.t0)

    def _event(self, kind: str, pod: dict, now: float) -> None:
        name = pod["metadata"]["name"]
        if not name.startswith(self.job + "-") or "reaper" in name:
            return
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        if "launcher" in name and self.launcher_cgroup is None:
            for c in pod.get("status", {}).get("containerStatuses", []):
                cid = c.get("containerID", "").rpartition("//")[2]
                if cid:
                    self.launcher_cgroup = Path("/sys/fs/cgroup/cpuacct/k8s.io") / cid / "cpuacct.usage"
        workers = [p for n, p in self.pods.items() if "-worker-" in n]
        if "workers" not in self.at and len(workers) == self.workers:
            if all(p["status"].get("phase") == "Running" for p in workers):
                self.at["workers"] = now
        live = [p for p in self.pods.values() if p["status"].get("phase") not in ("Succeeded", "Failed")]
        if "workers" in self.at and not live and "released" not in self.at:
            self.at["released"] = now
            self.done.set()

    def _sample(self) -> None:
        while not self.done.is_set():
            if self.launcher_cgroup is not None:
                try:
                    self.launcher_cpu = int(self.launcher_cgroup.read_text()) / 1e9
                except OSError:  # not there yet, or gone with the container
                    pass
            time.sleep(0.05)

    def wait(self, timeout: float) -> None:
        self.done.wait(timeout)
        self.proc.kill()
        self.proc.wait()


def request_count(cluster) -> tuple[int, int]:
    """All and mutating requests kube-apiserver has served (its apiserver_request_total)."""
    total = mutating = 0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, _, value = line.rpartition("} ")
            n = int(float(value))
            total += n
            verb = labels.split('verb="', 1)[1].split('"', 1)[0] if 'verb="' in labels else ""
            mutating += n if verb in MUTATING else 0
    return total, mutating


def proc_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def placed(ranks: list[dict], job: str, n: int, slots: int) -> bool:
    return [r["rank"] for r in ranks] == list(range(n)) and all(
        r["hostname"] == f"{job}-worker-{r['rank'] // slots}" and r["sum"] == n * (n + 1) // 2 for r in ranks
    )


def ranks_of(text: str) -> list[dict]:
    from support.real_pods import ranks_from

    return ranks_from("\n".join(line.partition(" ")[2] if line[:2] == "20" else line for line in text.splitlines()))


def operator_run(
    cluster,
    op_pid,
    image,
    job,
    workers,
    slots,
    ns="default",
    placement=None,
    extra=None,
    kubeconfig=None,
    timeout=240,
    mpirun_args=(),
) -> dict:
    """One MPIJob, submitted with ``kubeconfig`` (the admin's by default); its numbers."""
    from testbeds.k8s import mpi_operator as mo

    placement = mo.real_node_placement() if placement is None else placement
    manifest = mo.mpijob(job, image, workers, slots, ["python3", mo.PROGRAM], ns, placement, extra, mpirun_args)
    la, base = load(), request_count(cluster)
    cpu0 = proc_cpu(op_pid)
    watch = PodWatch(cluster, job, workers, ns)
    wall0 = time.time()
    t0 = watch.t0 = time.monotonic()
    kubeconfig = kubeconfig or cluster.kubeconfig
    apply = subprocess.Popen(
        [cluster.kubectl_bin, f"--kubeconfig={kubeconfig}", "apply", "-f", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    apply.stdin.write(json.dumps(manifest))
    apply.stdin.close()
    refused = apply.stderr.read().strip()
    _, status, usage = os.wait4(apply.pid, 0)
    apply.returncode = os.waitstatus_to_exitcode(status)
    client = usage.ru_utime + usage.ru_stime
    if apply.returncode != 0:
        watch.wait(0)
        return {"ok": False, "error": refused.splitlines()[-1] if refused else f"kubectl apply: {apply.returncode}"}
    exit_at = state = None
    deadline = t0 + timeout
    mpijob = subprocess.Popen(  # the MPIJob's conditions, as `kubectl wait` would see them
        [cluster.kubectl_bin, f"--kubeconfig={kubeconfig}", "get", "mpijob", job, "-n", ns] + ["--watch", "-o", "json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(timeout, mpijob.kill)  # a job stuck (refused pods) prints nothing more
    timer.start()
    for obj in json_stream(mpijob.stdout):
        true = {x["type"] for x in obj.get("status", {}).get("conditions", []) if x.get("status") == "True"}
        if true & {"Succeeded", "Failed"}:
            exit_at, state = time.monotonic() - t0, "Succeeded" if "Succeeded" in true else "Failed"
            break
    timer.cancel()
    mpijob.kill()
    mpijob.wait()
    watch.wait(max(1.0, deadline - time.monotonic()) if state else 1.0)
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "type=Warning", "-o", "json", check=False
    ).stdout
    warnings = [
        f"{e.get('reason')}: {' '.join(str(e.get('message', '')).split())}"
        for e in (json.loads(events)["items"] if events.strip() else [])
        if e.get("involvedObject", {}).get("name", "").startswith(job)
    ]
    logs = cluster.kubectl(
        "logs",
        "--timestamps",
        "--tail=-1",
        "-n",
        ns,
        "-l",
        f"training.kubeflow.org/job-name={job},training.kubeflow.org/job-role=launcher",
        check=False,
    ).stdout
    first = None
    for line in logs.splitlines():
        if '"rank"' in line:
            stamp = datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
            first = stamp - wall0
            break
    time.sleep(2)
    reqs = [a - b for a, b in zip(request_count(cluster), base)]
    ranks = ranks_of(logs)
    cluster.kubectl("delete", "mpijob", job, "-n", ns, "--wait=true", check=False, timeout=120)
    return {
        "workers": watch.at.get("workers"),
        "first": first,
        "exit": exit_at,
        "released": watch.at.get("released"),
        "ok": state == "Succeeded",
        "placed": placed(ranks, job, workers * slots, slots),
        "hosts": sorted({r["hostname"] for r in ranks}),
        "requests": reqs,
        "launcher_cpu": watch.launcher_cpu,
        "client_cpu": client,
        "controller_cpu": proc_cpu(op_pid) - cpu0,
        "load": la,
        "error": None
        if state == "Succeeded"
        else f"MPIJob {state or 'not finished'}; events: "
        + " | ".join(" ".join(w.split()) for w in warnings[-3:])
        + "; launcher log: "
        + " | ".join(
            [text for text in (line.partition(" ")[2].strip() for line in logs.splitlines()) if text.strip("-")][:2]
        ),
    }


def mpilaunch_run(cluster, op_pid, image, job, workers, slots, launcher, ns=None, env_extra=None, args=()) -> dict:
    from testbeds.k8s.node import JOB_ARGS

    out = Path(tempfile.mkdtemp(prefix="bench-mo-"))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONPATH": str(REPO), **(env_extra or {})}
    local = ["--launcher", "local", "--mpirun", MPIRUN] if launcher == "local" else ["--launcher", "cluster"]
    argv = [sys.executable, "-m", "mpilaunch", "--backend", "k8s", "--image", image, "--name", job, *JOB_ARGS]
    argv += [*(["--namespace", ns] if ns else []), *args, *local, "--np", str(workers * slots)]
    argv += [
        "--slots-per-worker",
        str(slots),
        "--output-dir",
        str(out),
        "-q",
        "--",
        "python3",
        "/home/mpiuser/placement.py",
    ]
    la, base = load(), request_count(cluster)
    cpu0 = proc_cpu(op_pid)
    watch = PodWatch(cluster, job, workers, ns or "default")
    t0 = watch.t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and '"rank"' in line:
            first = time.monotonic() - t0
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    end = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    watch.wait(max(1.0, 30 - (time.monotonic() - t0 - end)))
    time.sleep(2)
    reqs = [a - b for a, b in zip(request_count(cluster), base)]
    if proc.returncode != 0:
        print(f"# mpilaunch {launcher} {job} failed: {err[-800:]}", file=sys.stderr)
    try:  # where mpilaunch's own time went (report.json's timings: s since planning began)
        timings = json.loads((out / "report.json").read_text())["timings"]
        phases, pods = timings.get("phases") or {}, timings.get("workers") or {}
    except (OSError, ValueError, KeyError):
        phases, pods = {}, {}
    shutil.rmtree(out, ignore_errors=True)  # the ranks' logs: read from stdout above, not kept
    ranks = ranks_of("".join(lines))
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "workers": watch.at.get("workers"),
        "first": first,
        "exit": end,
        "released": watch.at.get("released", end),
        "ok": proc.returncode == 0,
        "placed": placed(ranks, job, workers * slots, slots),
        "hosts": sorted({r["hostname"] for r in ranks}),
        "requests": reqs,
        "launcher_cpu": cpu if launcher == "local" else watch.launcher_cpu,
        "client_cpu": cpu,
        "controller_cpu": proc_cpu(op_pid) - cpu0,
        "load": la,
        "error": err.strip().splitlines()[-1] if proc.returncode and err.strip() else None,
        "phases": phases,
        "worker_phases": pods,
    }


def idle_rate(cluster, seconds: float = 10.0) -> float:
    """API requests per second with nothing submitted (node heartbeats, leases, controllers)."""
    a = request_count(cluster)[0]
    time.sleep(seconds)
    return (request_count(cluster)[0] - a - 1) / seconds  # less the /metrics read itself


COLUMNS = [
    ("workers Running", "workers"),
    ("first rank line", "first"),
    ("exit", "exit"),
    ("released", "released"),
]


def table(rows: list[dict], rate: float, title: str) -> None:
    print(f"### {title}")
    print()
    print(
        "| system | "
        + " | ".join(c for c, _ in COLUMNS)
        + " | API requests (mutating), less idle | launcher CPU s | client CPU s | controller CPU s | placed | ok |"
    )
    print("| --- " * (len(COLUMNS) + 7) + "|")
    for system in SYSTEMS:
        runs = [r[system] for r in rows if system in r]
        if not runs:
            continue
        cells = [fmt(median([r[k] for r in runs])) for _, k in COLUMNS]
        req = median([r["requests"][0] - rate * (r["released"] or r["exit"] or 0) for r in runs])
        mut = median([r["requests"][1] for r in runs])
        cells.append(f"{req:.0f} ({mut:.0f})")
        cells += [f"{median([r[k] for r in runs]):.2f}" for k in ("launcher_cpu", "client_cpu")]
        cells.append(f"{median([r['controller_cpu'] for r in runs]):.2f}" if system == "mpi-operator" else "-")
        cells.append(f"{sum(r['placed'] for r in runs)}/{len(runs)}")
        cells.append(f"{sum(r['ok'] for r in runs)}/{len(runs)}")
        print(f"| {system} | " + " | ".join(cells) + " |")
    print()
    print("Every run (workers / first / exit / released, s; load 1/5/15 min):")
    print()
    for i, r in enumerate(rows):
        parts = [
            f"{s} {'/'.join(fmt(r[s][k]) for _, k in COLUMNS)}{'' if r[s]['ok'] else ' FAILED'}"
            for s in SYSTEMS
            if s in r
        ]
        print(f"- run {i}: " + "; ".join(parts) + f" (load {next(iter(r.values()))['load']})")
    print()


def rounds(cluster, op_pid, image, workers, slots, repeat, settle, tag, systems=SYSTEMS) -> list[dict]:
    runners = {
        "mpi-operator": lambda job: operator_run(cluster, op_pid, image, job, workers, slots),
        "mpilaunch cluster": lambda job: mpilaunch_run(cluster, op_pid, image, job, workers, slots, "cluster"),
        "mpilaunch local": lambda job: mpilaunch_run(cluster, op_pid, image, job, workers, slots, "local"),
    }
    rows = []
    for i in range(repeat):
        order = systems[i % len(systems) :] + systems[: i % len(systems)]
        row = {}
        for k, system in enumerate(order):
            time.sleep(settle + random.random())
            row[system] = runners[system](f"mo-{tag}{SYSTEMS.index(system)}-{i}")
        rows.append(row)
        print(
            f"# {tag} run {i}: "
            + "; ".join(f"{s} first {fmt(v['first'])} exit {fmt(v['exit'])} ok {v['ok']}" for s, v in row.items()),
            file=sys.stderr,
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["2x2", "8x1"], help="WORKERSxSLOTS per job")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of quiet (+ up to 1 s) before each run")
    ap.add_argument("--workdir", help="attach to a testbed started with `cluster up --real-node`")
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--no-tenant", action="store_true")
    ap.add_argument("--no-ompi5", action="store_true")
    args = ap.parse_args(argv)
    from bench_vs_mpi_operator_extra import ompi5, tenant  # the two one-off checks

    from testbeds.k8s import mpi_operator as mo
    from testbeds.k8s.cluster import KubeCluster

    t_build = time.monotonic()
    mo.ensure_built()
    own = None
    cluster = KubeCluster.attach(args.workdir) if args.workdir else None
    if cluster is None:
        own = cluster = KubeCluster(real_node=True).start()
    saved: dict = {}
    try:
        image = cluster.node.foreign_image("mpiop")
        op = mo.MpiOperator(cluster).start()
        print(
            f"# peer ready in {time.monotonic() - t_build:.1f}s (operator start {op.start_seconds:.1f}s)",
            file=sys.stderr,
        )
        op_pid = cluster.pids.get(mo.COMPONENT)
        rate = idle_rate(cluster)
        saved["idle_requests_per_s"] = rate
        print(f"Idle API requests: {rate:.1f}/s (subtracted per run over its duration). Load at start: {load()}.")
        print()
        for shape in args.shapes:
            workers, slots = (int(x) for x in shape.split("x"))
            rows = rounds(cluster, op_pid, image, workers, slots, args.repeat, args.settle, f"{workers}x{slots}")
            saved[shape] = rows
            table(
                rows,
                rate,
                f"{workers * slots} ranks on {workers} pods ({slots} per pod), Open MPI 4.1, {args.repeat} runs each",
            )
        if not args.no_ompi5:
            image5 = cluster.node.foreign_image("mpiop5")
            saved["ompi5"] = ompi5(cluster, op_pid, image5, rounds, table, rate, operator_run)
        if not args.no_tenant:
            saved["tenant"] = tenant(cluster, op_pid, image, operator_run, mpilaunch_run)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1, default=str))
        if own is not None:
            own.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
