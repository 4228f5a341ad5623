"""Entry point of the launcher pod: ``python3 -m mpilaunch.launchers.k8s LAUNCH_JSON``.

Runs inside the cluster with the job's ServiceAccount (in-cluster
credentials: ``KUBERNETES_SERVICE_HOST/PORT`` and the token and CA under
``$MPILAUNCH_K8S_SA_DIR``, default
``/var/run/secrets/kubernetes.io/serviceaccount``; the token file is re-read
by every shim, so rotated tokens keep working). It

1. waits until every worker pod is Ready (``get`` on each pod by name, which
   is all the Role allows) — the launcher never races the workers;
2. finds the image's mpirun and renders the hostfile for its flavour;
3. runs mpirun with ``mpilaunch-rsh`` as the rsh agent, exec transport,
   and exits with mpirun's status. mpirun's tagged output goes to the pod log
   unchanged; the CLI that follows the log reads rank status lines from it.

Standard library plus mpilaunch's pure modules: no Kubernetes client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..procs import forward_signals_to_group
from .. import hostfile, mpi
from ..errors import MpilaunchError, UsageError
from ..backends.k8s_api import Api, ApiError, sa_dir

WORKER_CONTAINER = "worker"


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def wait_workers(api: Api, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    last_error = None
    while pending:
        still = []
        for name in pending:
            try:
                if not _ready(api.get("v1", "pods", name)):
                    still.append(name)
            except ApiError as e:
                if e.status == 403:
                    raise UsageError(f"the launcher may not read pod {name}: {e.message}", "check the job's Role") from None
                last_error = e.message
                still.append(name)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                raise MpilaunchError(f"{len(pending)} workers not ready: {', '.join(pending[:5])}"
                                     + (f" ({last_error})" if last_error else ""), None)
            time.sleep(0.5)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mpilaunch.launchers.k8s LAUNCH_JSON", file=sys.stderr)
        return 2
    launch = json.loads(Path(argv[0]).read_text())
    creds = {"in_cluster": True, "sa_dir": sa_dir(), "namespace": launch["namespace"]}
    workers = [(name, int(slots)) for name, slots in launch["workers"]]
    rundir = Path(tempfile.mkdtemp(prefix=f"mpilaunch-{launch['job']}-"))
    proc = relay = None
    try:
        api = Api(creds)
        wait_workers(api, [n for n, _ in workers], float(launch.get("start_timeout", 300)))
        info = mpi.find_mpirun(launch.get("mpi", "auto"), launch.get("mpirun"), os.environ.get("PATH"))
        (rundir / "hostfile").write_text(hostfile.render(workers, info.hostfile_flavour))
        context = {"job": launch["job"], "transport": "k8s", **creds,
                   "container": launch.get("container", WORKER_CONTAINER),
                   "workers": {n: {"pod": n} for n, _ in workers}}
        if os.environ.get("MPILAUNCH_K8S_RELAY", "1") != "0":
            from ..backends import k8s_relay

            relay, context["relay"] = k8s_relay.start(dict(context), rundir)
        (rundir / "context.json").write_text(json.dumps(context))
        from ..workloads.mpirun import rank_command
        from ..workloads.base import shim_path
        from ..spec import JobSpec

        spec = JobSpec(command=tuple(launch["command"]), bind_gpus=bool(launch.get("bind_gpus")))
        python = os.environ.get("MPILAUNCH_K8S_PYTHON") or launch.get("rank_python") or "python3"
        command = mpi.build_mpirun(
            info, ranks=sum(s for _, s in workers), hosts=len(workers), hostfile=str(rundir / "hostfile"),
            shim=shim_path(rundir), command=rank_command(spec, [python, "-m", "mpilaunch.rank"]),
            environ=dict(os.environ), user_env=tuple(launch.get("env") or ()),
            extra_args=tuple(launch.get("mpi_args") or ()), as_root=os.geteuid() == 0,
        )
        command.env["MPILAUNCH_CONTEXT"] = str(rundir / "context.json")
        print(f"mpilaunch: launcher: {info.flavour} {info.version}, {len(workers)} workers ready", file=sys.stderr, flush=True)
        proc = subprocess.Popen(command.argv, env={**os.environ, **command.env}, stdin=subprocess.DEVNULL,
                                start_new_session=True)

        forward_signals_to_group(proc.pid)
        code = proc.wait()
        return 128 - code if code < 0 else code
    except MpilaunchError as e:
        print(e.format(), file=sys.stderr)
        return e.exit_code
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if relay is not None:
            from ..backends import k8s_relay

            k8s_relay.stop(relay)
        shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
