"""Asking the YARN testbed about nodes, applications and containers through the REST APIs;
a part of :class:`~testbeds.yarn.cluster.YarnCluster`. Stdlib only.
"""

from __future__ import annotations

import os
import shlex
import time

from .hadoop import YarnTestbedError, http, resource_value, tail


class YarnRest:
    """The ResourceManager's and NodeManagers' REST APIs (mixed into ``YarnCluster``)."""

    def rest(self, path, method="GET", body=None, timeout=10):
        """JSON from the RM REST API (path like '/ws/v1/cluster/nodes')."""
        return http(method, self.rm_webapp_url + path, body, timeout=timeout)

    def nm_rest(self, nm, path, timeout=10):
        """JSON from a NodeManager's REST API (nm: dict or index)."""
        if isinstance(nm, int):
            nm = self.nodemanagers[nm]
        return http("GET", nm["web_url"] + path, timeout=timeout)

    def cluster_info(self):
        return self.rest("/ws/v1/cluster/info")["clusterInfo"]

    def nodes(self):
        """RM view of all nodes (list of dicts with id, state, nodeLabels,
        totalResource, usedResource incl. resourceInformations)."""
        res = self.rest(
            "/ws/v1/cluster/nodes?states=NEW,RUNNING,UNHEALTHY,DECOMMISSIONING,DECOMMISSIONED,LOST,REBOOTED,SHUTDOWN"
        )
        return ((res or {}).get("nodes") or {}).get("node") or []

    def apps(self, states=None):
        q = "?states=" + ",".join(states) if states else ""
        res = self.rest("/ws/v1/cluster/apps" + q)
        return ((res or {}).get("apps") or {}).get("app") or []

    def app_info(self, app_id):
        """/ws/v1/cluster/apps/<id>: state, finalStatus, queue,
        amNodeLabelExpression, allocatedResources ... (dict)."""
        return self.rest("/ws/v1/cluster/apps/%s" % app_id)["app"]

    def app_attempts(self, app_id):
        res = self.rest("/ws/v1/cluster/apps/%s/appattempts" % app_id)
        return ((res or {}).get("appAttempts") or {}).get("appAttempt") or []

    def app_containers(self, app_id, attempt_id=None):
        """Running containers of an attempt (default: the latest) as the RM
        reports them (/apps/<id>/appattempts/<attempt>/containers)."""
        if attempt_id is None:
            attempts = self.app_attempts(app_id)
            if not attempts:
                return []
            attempt_id = attempts[-1].get("appAttemptId") or attempts[-1].get("id")
        res = self.rest("/ws/v1/cluster/apps/%s/appattempts/%s/containers" % (app_id, attempt_id))
        if not res:
            return []
        c = res.get("container") if "container" in res else (res.get("containers") or {}).get("container")
        if isinstance(c, dict):
            c = [c]
        return c or []

    def container_logs(self, app_id, lines=30):
        """The tail of every log file the application's containers wrote, on every NodeManager
        (``nmN/logs/<app>/<container>/<file>``): a diagnostic for a job that stalled, whose
        workdir a stopped testbed removes."""
        out = []
        for nm in self.nodemanagers:
            app_dir = os.path.join(nm["log_dir"], app_id)
            try:
                containers = sorted(os.listdir(app_dir))
            except OSError:
                continue
            for container in containers:
                cdir = os.path.join(app_dir, container)
                for name in sorted(os.listdir(cdir)):
                    if name in ("directory.info", "launch_container.sh", "prelaunch.out"):
                        continue
                    text = tail(os.path.join(cdir, name), lines)
                    if text.strip():
                        out.append("---- nm%d %s %s:\n%s" % (nm["index"], container, name, text.rstrip("\n")))
        return "\n".join(out)

    def nm_containers(self, app_id=None):
        """Containers as the NodeManagers report them (/ws/v1/node/containers),
        each dict extended with 'nm_index' and 'node_id'."""
        out = []
        for nm in self.nodemanagers:
            try:
                res = self.nm_rest(nm, "/ws/v1/node/containers")
            except (OSError, ValueError):
                continue
            cs = ((res or {}).get("containers") or {}).get("container") or []
            if isinstance(cs, dict):
                cs = [cs]
            for c in cs:
                if app_id and not c.get("id", "").startswith("container_" + app_id.split("_", 1)[-1] + "_"):
                    continue
                c = dict(c, nm_index=nm["index"], node_id=nm["node_id"])
                out.append(c)
        return out

    def app_resources(self, app_id, kind="used"):
        """Resources of an app per node partition, from the RM app report's
        resourceInfo.resourceUsagesByPartition: {partition: {"memory-mb": ..,
        "vcores": .., "yarn.io/gpu": ..}} (partition "" is the default one;
        kind: used, reserved, pending, amUsed).  Includes the AM container."""
        info = self.app_info(app_id)
        out = {}
        for part in (info.get("resourceInfo") or {}).get("resourceUsagesByPartition") or []:
            r = part.get(kind) or {}
            out[part.get("partitionName", "")] = {
                n: resource_value(r, n) for n in ("memory-mb", "vcores", "yarn.io/gpu")
            }
        return out

    def kill_app(self, app_id):
        """Kill through the RM REST API (PUT /apps/<id>/state KILLED)."""
        return self.rest("/ws/v1/cluster/apps/%s/state" % app_id, "PUT", {"state": "KILLED"})

    def wait_app(self, app_id, states=("FINISHED", "FAILED", "KILLED"), timeout=60.0):
        deadline = time.time() + timeout
        while True:
            info = self.app_info(app_id)
            if info["state"] in states:
                return info
            if time.time() > deadline:
                raise YarnTestbedError("app %s still %s" % (app_id, info["state"]))
            time.sleep(0.25)

    def scheduler(self):
        return self.rest("/ws/v1/cluster/scheduler")["scheduler"]["schedulerInfo"]

    def shell_exports(self):
        return "".join("export %s=%s\n" % (k, shlex.quote(v)) for k, v in self.env.items())
