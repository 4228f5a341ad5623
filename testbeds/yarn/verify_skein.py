"""End-to-end check of the YARN testbed with skein (needs `pip install skein`).

    python -m testbeds.yarn.verify_skein [--workdir DIR] [--keep]

Starts a cluster (or attaches to one started with `cluster up --workdir DIR`),
submits a skein application to queue `ml` with

* service `worker`: 2 containers, default partition; each writes
  $CONTAINER_ID / hostname / pid / cwd to a file, puts them in the skein
  key-value store (`skein kv put ... current`), starts a *daemonized*
  grandchild (setsid + fork, leaves the container's process group) and sleeps;
* service `gpu`: 1 container with `yarn.io/gpu: 4` on node label `gpu`;

then checks the RM REST API (state, queue, labels, allocated GPUs), finds the
container processes locally, kills the app, shows what outlived it and
checks that stop() leaves nothing behind.  Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from testbeds.procs import pid_alive
from testbeds.yarn.cluster import YarnCluster
from testbeds.yarn.hadoop import proc_environ, resource_value

SCRIPT = r"""
set -x
out="$OUTDIR/$CONTAINER_ID"
{
  echo "CONTAINER_ID=$CONTAINER_ID"
  echo "hostname=$(hostname)"
  echo "pid=$$ pgid=$(ps -o pgid= $$ | tr -d ' ') sid=$(ps -o sid= $$ | tr -d ' ')"
  echo "user=$(id -un) cwd=$PWD"
  env | sort | sed 's/^/env: /'
} > "$out.txt"
skein kv put --key "$CONTAINER_ID" --value "$(hostname) $$" current
python -c "import skein; c = skein.ApplicationClient.from_current(); c.kv['py-' + '$CONTAINER_ID'] = b'ok'"
# a daemonized grandchild, as orted/prted --daemonize would do
setsid sh -c 'echo $$ > "'"$out"'.daemon"; exec sleep 3600' < /dev/null > /dev/null 2>&1 &
sleep 3600
"""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = ap.parse_args(argv)

    t0 = time.time()
    if args.workdir and os.path.exists(os.path.join(args.workdir, "state.json")):
        yc = YarnCluster.attach(args.workdir)
    else:
        yc = YarnCluster(workdir=args.workdir).start()
    summary = {"cluster_start_s": round(time.time() - t0, 1)}
    os.environ.update(yc.env)
    import skein  # after SKEIN_CONFIG is set: skein reads it at import time

    outdir = os.path.join(yc.workdir, "verify-out")
    os.makedirs(outdir, exist_ok=True)
    try:
        t = time.time()
        client = skein.Client(log=os.path.join(yc.workdir, "logs", "skein-driver.log"))
        summary["skein_driver_start_s"] = round(time.time() - t, 2)
        spec = skein.ApplicationSpec(
            name="mpilaunch-testbed-verify",
            queue="ml",
            master=skein.Master(resources=skein.Resources(memory=256, vcores=1)),
            services={
                "worker": skein.Service(
                    instances=2, resources=skein.Resources(memory=128, vcores=1), env={"OUTDIR": outdir}, script=SCRIPT
                ),
                "gpu": skein.Service(
                    instances=1,
                    resources=skein.Resources(memory=128, vcores=1, gpus=4),
                    node_label=yc.node_label,
                    env={"OUTDIR": outdir},
                    script=SCRIPT,
                ),
            },
        )
        t = time.time()
        app_id = client.submit(spec)
        summary["app_id"] = app_id
        app = client.connect(app_id, wait=True)
        summary["submit_to_am_running_s"] = round(time.time() - t, 2)
        # wait for the three containers and their kv puts
        deadline = time.time() + 90
        while True:
            kv = dict(app.kv)
            if sum(1 for k in kv if k.startswith("container_")) >= 3 and sum(1 for k in kv if k.startswith("py-")) >= 3:
                break
            if time.time() > deadline:
                raise RuntimeError(
                    "containers did not report: %r %r"
                    % (kv, app.get_containers(states=list(skein.model.ContainerState)))
                )
            time.sleep(0.5)
        summary["submit_to_all_running_s"] = round(time.time() - t, 2)
        summary["kv"] = {k: v.decode() for k, v in kv.items()}
        containers = app.get_containers()
        summary["skein_containers"] = [
            {
                "id": c.yarn_container_id,
                "service": c.service_name,
                "node": c.yarn_node_http_address,
                "state": str(c.state),
            }
            for c in containers
        ]

        info = yc.app_info(app_id)
        summary["rm_app"] = {
            k: info.get(k)
            for k in (
                "state",
                "finalStatus",
                "queue",
                "user",
                "amNodeLabelExpression",
                "appNodeLabelExpression",
                "allocatedMB",
                "allocatedVCores",
                "runningContainers",
                "amHostHttpAddress",
            )
        }
        summary["rm_app_resources_by_partition"] = yc.app_resources(app_id)
        summary["rm_container_gpus"] = {
            c["containerId"]: (c["nodeId"], resource_value(c.get("allocatedResources"), "yarn.io/gpu"))
            for c in yc.app_containers(app_id)
        }
        summary["rm_attempts"] = yc.app_attempts(app_id)
        rm_cs = yc.app_containers(app_id)
        summary["rm_containers"] = rm_cs
        summary["nm_containers"] = yc.nm_containers(app_id)
        summary["nodes"] = [
            {
                "id": n["id"],
                "labels": n.get("nodeLabels"),
                "used_gpu": resource_value(n.get("usedResource"), "yarn.io/gpu"),
                "avail_gpu": resource_value(n.get("availableResource"), "yarn.io/gpu"),
            }
            for n in yc.nodes()
        ]

        # local processes of the containers
        procs = {}
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            env = proc_environ(pid)
            if env.get("CONTAINER_ID", "").startswith("container_") and app_id.split("_", 1)[1] in env["CONTAINER_ID"]:
                try:
                    cmd = open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()[:80]
                    stat = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                procs[pid] = {
                    "cid": env["CONTAINER_ID"],
                    "ppid": int(stat[1]),
                    "pgid": int(stat[2]),
                    "sid": int(stat[3]),
                    "cmd": cmd,
                }
        summary["container_processes"] = procs
        with open(os.path.join(outdir, sorted(f for f in os.listdir(outdir) if f.endswith(".txt"))[0])) as f:
            summary["container_sample_txt"] = f.read()

        # kill and look at what survives
        t = time.time()
        client.kill_application(app_id)
        final = yc.wait_app(app_id, timeout=60)
        summary["kill_to_killed_s"] = round(time.time() - t, 2)
        summary["rm_app_after_kill"] = {k: final.get(k) for k in ("state", "finalStatus", "diagnostics")}
        time.sleep(3)
        summary["alive_after_kill"] = {pid: p for pid, p in procs.items() if pid_alive(pid)}
        client.close()
    finally:
        if not args.keep:
            t = time.time()
            left_before = yc.leftover_processes()
            wd = yc.workdir
            yc.stop()
            summary["stop_s"] = round(time.time() - t, 2)
            summary["leftovers_before_stop"] = left_before
            yc.workdir = wd
            summary["leftovers_after_stop"] = yc.leftover_processes()  # reads /proc only
    json.dump(summary, sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
