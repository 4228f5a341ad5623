"""The YARN testbed's configuration: site files, resource types, the CapacityScheduler's queues
and node labels; a part of :class:`~testbeds.yarn.cluster.YarnCluster`. Stdlib only.
"""

from __future__ import annotations

import os
import sys

from ..ports import free_ports
from .hadoop import (
    BIN_DIR,
    CLIENT_DIR,
    FAKE_GPU_BIN,
    HADOOP_HOME,
    JPMS_OPTS,
    JVM_TUNING,
    MARKER_VAR,
    user_name,
    write_xml,
)


class YarnConfig:
    """Writes the cluster's configuration directories (mixed into ``YarnCluster``)."""

    def _configure(self):
        w = self.workdir
        n = self.num_nodemanagers
        ports = free_ports(5 + 3 * n)
        rm_ports = dict(zip(("address", "scheduler", "tracker", "admin", "webapp"), ports[:5]))
        self.rm_address = "127.0.0.1:%d" % rm_ports["address"]
        self.rm_webapp_url = "http://127.0.0.1:%d" % rm_ports["webapp"]
        self.conf_dir = os.path.join(w, "conf")
        for sub in ("conf", "logs", "node-labels", "skein", "home", "tmp"):
            os.makedirs(os.path.join(w, sub), exist_ok=True)
        py_bin = os.path.dirname(sys.executable)
        path = os.pathsep.join(
            [BIN_DIR, py_bin, os.path.join(self.java_home, "bin"), os.environ.get("PATH", "/usr/bin:/bin")]
        )
        self._daemon_path = path

        core = {
            # skein 0.8.2's driver NPEs when the staging FS and the local FS
            # are both file:/// (Utils.equalFs: srcHost.equals(dstHost) with
            # null hosts: "Cannot invoke String.equals(Object) because srcHost
            # is null").  A viewfs:// default FS whose mount table falls back
            # to the local file system sidesteps it; skein stages under the
            # viewfs home dir <workdir>/home/.skein/<app id>.
            "fs.defaultFS": "viewfs://testbed/",
            "fs.viewfs.mounttable.testbed.link." + w: "file://" + w,
            "fs.viewfs.mounttable.testbed.linkFallback": "file:///",
            "fs.viewfs.mounttable.testbed.homedir": os.path.join(w, "home"),
            "hadoop.tmp.dir": os.path.join(w, "tmp"),
            "hadoop.security.authentication": "simple",
            # RM REST admin calls (node labels, app kill) run as this user
            "hadoop.http.staticuser.user": user_name(),
        }
        yarn = {
            "yarn.resourcemanager.hostname": "127.0.0.1",
            "yarn.resourcemanager.address": self.rm_address,
            "yarn.resourcemanager.scheduler.address": "127.0.0.1:%d" % rm_ports["scheduler"],
            "yarn.resourcemanager.resource-tracker.address": "127.0.0.1:%d" % rm_ports["tracker"],
            "yarn.resourcemanager.admin.address": "127.0.0.1:%d" % rm_ports["admin"],
            "yarn.resourcemanager.webapp.address": "127.0.0.1:%d" % rm_ports["webapp"],
            "yarn.resourcemanager.scheduler.class": "org.apache.hadoop.yarn.server.resourcemanager.scheduler.capacity.CapacityScheduler",
            "yarn.resourcemanager.recovery.enabled": "false",
            "yarn.resourcemanager.nodemanagers.heartbeat-interval-ms": "250",
            "yarn.resourcemanager.connect.retry-interval.ms": "200",
            "yarn.resourcemanager.connect.max-wait.ms": "120000",
            "yarn.system-metrics-publisher.enabled": "false",
            "yarn.timeline-service.enabled": "false",
            "yarn.log-aggregation-enable": "false",
            "yarn.acl.enable": "false",
            "yarn.scheduler.minimum-allocation-mb": "64",
            "yarn.scheduler.maximum-allocation-mb": str(self.memory_mb),
            "yarn.scheduler.minimum-allocation-vcores": "1",
            "yarn.scheduler.maximum-allocation-vcores": str(self.vcores),
            "yarn.node-labels.enabled": "true" if self.node_label else "false",
            "yarn.node-labels.fs-store.root-dir": "file://" + os.path.join(w, "node-labels"),
            # ---- NodeManager (per-NM values are overridden below) ----
            "yarn.nodemanager.container-executor.class": "org.apache.hadoop.yarn.server.nodemanager.DefaultContainerExecutor",
            "yarn.nodemanager.resource.memory-mb": str(self.memory_mb),
            "yarn.nodemanager.resource.cpu-vcores": str(self.vcores),
            "yarn.nodemanager.pmem-check-enabled": "false",
            "yarn.nodemanager.vmem-check-enabled": "false",
            "yarn.nodemanager.recovery.enabled": "false",
            "yarn.nodemanager.aux-services": "",
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "100.0",
            "yarn.nodemanager.disk-health-checker.min-free-space-per-disk-mb": "0",
            "yarn.nodemanager.user-home-dir": os.path.expanduser("~"),
            "yarn.nodemanager.env-whitelist": "JAVA_HOME,HADOOP_COMMON_HOME,HADOOP_HDFS_HOME,HADOOP_CONF_DIR,"
            "CLASSPATH_PREPEND_DISTCACHE,HADOOP_YARN_HOME,HADOOP_HOME,PATH,LANG,TZ",
            # Every container process carries this marker, so stop() can find
            # (and kill) daemonized leftovers that escaped the process group.
            # PATH is set here because the env-whitelist does not work for it
            # with the DefaultContainerExecutor: launch_container.sh does
            # `export PATH=${PATH:-<NM's PATH>}` but runs under a bash started
            # with an empty environment, which has already set its built-in
            # default PATH (/usr/local/bin:...:/bin:/sbin:.).  admin-env is
            # forced in (appended, ':'-separated, after a PATH the app sets).
            "yarn.nodemanager.admin-env": "MALLOC_ARENA_MAX=$MALLOC_ARENA_MAX,%s=%s,PATH=%s%s"
            % (
                MARKER_VAR,
                self.token,
                # containers find the fake nvidia-smi as they would the
                # real one on a GPU node (mpilaunch maps slots to GPUs)
                path + (os.pathsep + FAKE_GPU_BIN if self.gpus_per_node else ""),
                (",JAVA_TOOL_OPTIONS=" + self.container_java_tool_options) if self.container_java_tool_options else "",
            ),
            # NM shutdown waits sleep-delay + process-kill-wait (+1 s) for
            # its containers to die (default ~7 s)
            "yarn.nodemanager.process-kill-wait.ms": "1000",
            # what skein puts after .skein.jar on its ApplicationMaster's
            # CLASSPATH: the shaded client jars, as `yarn classpath` prints
            "yarn.application.classpath": "$HADOOP_CONF_DIR,%s/*" % CLIENT_DIR,
        }
        if self.gpus_per_node is not None:
            yarn.update(
                {
                    "yarn.nodemanager.resource-plugins": "yarn.io/gpu",
                    "yarn.nodemanager.resource-plugins.gpu.allowed-gpu-devices": "auto",
                    # No GPU here: a fake nvidia-smi (testbeds/yarn/fake-gpu-bin)
                    # prints `nvidia-smi -q -x` XML for $MPILAUNCH_FAKE_GPUS GPUs.
                    "yarn.nodemanager.resource-plugins.gpu.path-to-discovery-executables": FAKE_GPU_BIN,
                }
            )
        resource_types = {"yarn.resource-types": "yarn.io/gpu"}
        cs = self._capacity_scheduler()
        log4j = "\n".join(
            [
                "hadoop.root.logger=WARN,console",
                "log4j.rootLogger=${hadoop.root.logger}",
                "log4j.appender.console=org.apache.log4j.ConsoleAppender",
                "log4j.appender.console.target=System.err",
                "log4j.appender.console.layout=org.apache.log4j.PatternLayout",
                "log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n",
                "log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR",
                "",
            ]
        )

        def write_conf(d, yarn_props):
            os.makedirs(d, exist_ok=True)
            write_xml(os.path.join(d, "core-site.xml"), core)
            write_xml(os.path.join(d, "yarn-site.xml"), yarn_props)
            write_xml(os.path.join(d, "resource-types.xml"), resource_types)
            write_xml(os.path.join(d, "capacity-scheduler.xml"), cs)
            with open(os.path.join(d, "log4j.properties"), "w") as f:
                f.write(log4j)

        write_conf(self.conf_dir, yarn)
        self.nodemanagers = []
        for i in range(n):
            p_addr, p_loc, p_web = ports[5 + 3 * i : 8 + 3 * i]
            nmdir = os.path.join(w, "nm%d" % i)
            local_dir = os.path.join(nmdir, "local")
            log_dir = os.path.join(nmdir, "logs")
            for d in (local_dir, log_dir):
                os.makedirs(d, exist_ok=True)
            nm_yarn = dict(yarn)
            nm_yarn.update(
                {
                    "yarn.nodemanager.hostname": "127.0.0.1",
                    "yarn.nodemanager.bind-host": "127.0.0.1",
                    "yarn.nodemanager.address": "127.0.0.1:%d" % p_addr,
                    "yarn.nodemanager.localizer.address": "127.0.0.1:%d" % p_loc,
                    "yarn.nodemanager.webapp.address": "127.0.0.1:%d" % p_web,
                    "yarn.nodemanager.local-dirs": local_dir,
                    "yarn.nodemanager.log-dirs": log_dir,
                }
            )
            conf = os.path.join(nmdir, "conf")
            write_conf(conf, nm_yarn)
            label = self.node_label if i in self.labeled_nodes else ""
            self.nodemanagers.append(
                {
                    "index": i,
                    "node_id": "127.0.0.1:%d" % p_addr,
                    "address": "127.0.0.1:%d" % p_addr,
                    "http_address": "127.0.0.1:%d" % p_web,
                    "web_url": "http://127.0.0.1:%d" % p_web,
                    "label": label,
                    "gpus": self.gpus_per_node or 0,
                    "memory_mb": self.memory_mb,
                    "vcores": self.vcores,
                    "pid": None,
                    "conf_dir": conf,
                    "local_dir": local_dir,
                    "log_dir": log_dir,
                    "dir": nmdir,
                }
            )
        self.env = {
            "PATH": path,
            "JAVA_HOME": self.java_home,
            "HADOOP_CONF_DIR": self.conf_dir,
            "YARN_CONF_DIR": self.conf_dir,
            "HADOOP_HOME": HADOOP_HOME,
            "SKEIN_CONFIG": os.path.join(w, "skein"),
            "SKEIN_DRIVER_JAVA_OPTIONS": " ".join(JPMS_OPTS + JVM_TUNING),
        }

    def _capacity_scheduler(self):
        p = "yarn.scheduler.capacity."
        cs = {
            p + "resource-calculator": "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator",
            p + "maximum-am-resource-percent": "0.5",
            p + "node-locality-delay": "-1",
            p + "root.queues": ",".join(self.queues),
            p + "root.acl_submit_applications": "*",
            p + "root.acl_administer_queue": "*",
        }
        share = 100.0 / len(self.queues)
        for q in self.queues:
            qp = p + "root." + q + "."
            cs[qp + "capacity"] = "%g" % share
            cs[qp + "maximum-capacity"] = "100"
            cs[qp + "user-limit-factor"] = "100"
            cs[qp + "state"] = "RUNNING"
        if self.node_label:
            lab = self.node_label
            cs[p + "root.accessible-node-labels.%s.capacity" % lab] = "100"
            cs[p + "root.ml.accessible-node-labels"] = lab
            cs[p + "root.ml.accessible-node-labels.%s.capacity" % lab] = "100"
            cs[p + "root.ml.accessible-node-labels.%s.maximum-capacity" % lab] = "100"
            cs[p + "root.default.accessible-node-labels"] = " "
        return cs
