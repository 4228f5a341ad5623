"""A real, pseudo-distributed YARN cluster for tests (stdlib only).

One ResourceManager and N NodeManagers run as separate JVMs on 127.0.0.1
with random free ports, from Hadoop jars fetched from Maven Central
(``testbeds/yarn/fetch.sh``, cached in ``$MPILAUNCH_CACHE/mpilaunch-yarn``).
Containers run as plain local processes (DefaultContainerExecutor), as the
user running the tests.

* Resource types: memory, vcores and ``yarn.io/gpu``.  The NodeManager GPU
  plugin discovers GPUs with the fake ``fake-gpu-bin/nvidia-smi`` (there is
  no GPU here); GPUs are counted and scheduled (DominantResourceCalculator),
  not isolated.
* CapacityScheduler queues ``root.default`` and ``root.ml`` (50/50, both
  elastic to 100%); node label ``gpu`` (exclusive) on the last NodeManager(s),
  accessible from ``root.ml`` only.
* ``env`` holds what skein needs (PATH with the ``yarn`` shim, JAVA_HOME,
  HADOOP_CONF_DIR, HADOOP_HOME, SKEIN_CONFIG, SKEIN_DRIVER_JAVA_OPTIONS).

Usage::

    from testbeds.yarn.cluster import YarnCluster
    with YarnCluster() as yc:
        os.environ.update(yc.env)
        ...
        yc.app_info(app_id)

CLI::

    python -m testbeds.yarn.cluster up [--workdir DIR] [--nodemanagers N]
    python -m testbeds.yarn.cluster status [--workdir DIR]
    python -m testbeds.yarn.cluster down [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from xml.sax.saxutils import escape

from ..ports import free_ports
from ..procs import pid_alive

HERE = os.path.dirname(os.path.abspath(__file__))
FETCH_SH = os.path.join(HERE, "fetch.sh")
FAKE_GPU_BIN = os.path.join(HERE, "fake-gpu-bin")
HADOOP_VERSION = "3.5.0"  # keep in sync with pom.xml
CACHE_DIR = os.environ.get(
    "MPILAUNCH_YARN_CACHE",
    os.path.join(os.environ.get("MPILAUNCH_CACHE", os.path.expanduser("~/.cache")), "mpilaunch-yarn"),
)
HADOOP_HOME = os.path.join(CACHE_DIR, "hadoop-" + HADOOP_VERSION)
LIB_DIR = os.path.join(HADOOP_HOME, "lib")  # daemons (pom.xml)
CLIENT_DIR = os.path.join(HADOOP_HOME, "client")  # clients, skein AM (pom-client.xml)
BIN_DIR = os.path.join(CACHE_DIR, "bin")
YARN_SHIM = os.path.join(BIN_DIR, "yarn")
DEFAULT_CLI_WORKDIR = os.path.join(tempfile.gettempdir(), "mpilaunch-yarn-testbed")
STATE_FILE = "state.json"
MARKER_VAR = "MPILAUNCH_YARN_TESTBED"

# What Hadoop 3.5's own launcher scripts add on Java >= 17.
JPMS_OPTS = [
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.math=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.text=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.util=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.x509=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.dns=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
]
# Small, quick-starting daemons: this is a 2-core test machine.
JVM_TUNING = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k"]

RM_CLASS = "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"
NM_CLASS = "org.apache.hadoop.yarn.server.nodemanager.NodeManager"


class YarnTestbedError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# installation


def find_java_home():
    """JAVA_HOME to use: $MPILAUNCH_YARN_JAVA_HOME, $JAVA_HOME, then JDK 17."""
    for cand in (
        os.environ.get("MPILAUNCH_YARN_JAVA_HOME"),
        os.environ.get("JAVA_HOME"),
        "/usr/lib/jvm/java-17-openjdk-amd64",
        "/usr/lib/jvm/java-21-openjdk-amd64",
        "/usr/lib/jvm/temurin-25-jdk-amd64",
        "/usr/lib/jvm/default-java",
    ):
        if cand and os.access(os.path.join(cand, "bin", "java"), os.X_OK):
            return cand
    java = shutil.which("java")
    if java:
        return os.path.dirname(os.path.dirname(os.path.realpath(java)))
    raise YarnTestbedError("no Java found (set JAVA_HOME)")


def ensure_installed(quiet=True):
    """Fetch the pinned Hadoop jars (Maven) and write the yarn shim.

    Idempotent; when already cached this costs one `bash fetch.sh` (~20 ms).
    Returns the cache directory.
    """
    env = dict(os.environ)
    env.setdefault("JAVA_HOME", find_java_home())
    env["MPILAUNCH_YARN_CACHE"] = CACHE_DIR
    res = subprocess.run(["bash", FETCH_SH], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = res.stdout.decode(errors="replace")
    if res.returncode != 0:
        raise YarnTestbedError("fetch.sh failed (rc=%d):\n%s" % (res.returncode, out))
    if out and not quiet:
        sys.stderr.write(out)
    return CACHE_DIR


# --------------------------------------------------------------------------
# helpers


def _write_xml(path, props):
    lines = ['<?xml version="1.0"?>', "<configuration>"]
    for k, v in props.items():
        lines.append("  <property><name>%s</name><value>%s</value></property>" % (escape(k), escape(str(v))))
    lines.append("</configuration>\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _http(method, url, body=None, content_type="application/json", timeout=10):
    data = None
    headers = {"Accept": "application/json"}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = content_type
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _ancestors():
    pids = set()
    pid = os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def proc_environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log at %s)" % path


# --------------------------------------------------------------------------
# the cluster


class YarnCluster:
    """A ResourceManager plus ``num_nodemanagers`` NodeManagers (JVMs).

    Attributes (valid after ``start()``): ``workdir``, ``conf_dir`` (client
    HADOOP_CONF_DIR), ``rm_address`` (host:port of the client RPC),
    ``rm_webapp_url``, ``env`` (dict to merge into os.environ for skein /
    the yarn shim), ``nodemanagers`` (list of dicts: index, node_id,
    address, http_address, web_url, label, gpus, memory_mb, vcores, pid,
    conf_dir, local_dir, log_dir), ``queues``, ``node_label``.
    """

    def __init__(
        self,
        workdir=None,
        num_nodemanagers=2,
        gpus_per_node=4,
        memory_mb=8192,
        vcores=8,
        node_label="gpu",
        labeled_nodes=None,
        java_home=None,
        keep_workdir=None,
        rm_heap="512m",
        nm_heap="256m",
        startup_timeout=120.0,
        container_java_tool_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    ):
        if num_nodemanagers < 1:
            raise ValueError("need at least one NodeManager")
        self._own_workdir = workdir is None
        self.workdir = os.path.abspath(workdir) if workdir else None
        self.num_nodemanagers = num_nodemanagers
        self.gpus_per_node = gpus_per_node
        self.memory_mb = memory_mb
        self.vcores = vcores
        self.node_label = node_label
        if labeled_nodes is None:
            labeled_nodes = [num_nodemanagers - 1] if (node_label and num_nodemanagers > 1) else []
        self.labeled_nodes = list(labeled_nodes)
        self.java_home = java_home or find_java_home()
        self.keep_workdir = (not self._own_workdir) if keep_workdir is None else keep_workdir
        self.rm_heap = rm_heap
        self.nm_heap = nm_heap
        self.startup_timeout = startup_timeout
        # JAVA_TOOL_OPTIONS forced into every container (e.g. the skein AM,
        # whose JVM flags are fixed by skein); None/"" for none.
        self.container_java_tool_options = container_java_tool_options
        self.queues = ["default", "ml"]
        self.token = uuid.uuid4().hex
        self.conf_dir = None
        self.rm_address = None
        self.rm_webapp_url = None
        self.rm_pid = None
        self.env = {}
        self.nodemanagers = []
        self._procs = {}  # pid -> Popen (only in the process that started them)
        self._started = False

    # -- lifecycle --------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        if self._started:
            return self
        ensure_installed()
        if self.workdir is None:
            self.workdir = tempfile.mkdtemp(prefix="mpilaunch-yarn-")
        os.makedirs(self.workdir, exist_ok=True)
        self._started = True
        try:
            self._configure()
            # all JVMs at once: NMs retry the RM every 200 ms until it is up
            self._start_rm(wait=False)
            self._start_nms()
            self._wait_rm()
            self._wait_nodes()
            self._setup_labels()
            self._save_state()
        except BaseException:
            self.stop()
            raise
        return self

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
            "hadoop.http.staticuser.user": _user(),
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
            _write_xml(os.path.join(d, "core-site.xml"), core)
            _write_xml(os.path.join(d, "yarn-site.xml"), yarn_props)
            _write_xml(os.path.join(d, "resource-types.xml"), resource_types)
            _write_xml(os.path.join(d, "capacity-scheduler.xml"), cs)
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

    def _java_cmd(self, conf_dir, heap, cls, name):
        return (
            [os.path.join(self.java_home, "bin", "java")]
            + JPMS_OPTS
            + JVM_TUNING
            + [
                "-Xmx" + heap,
                "-Dproc_" + name,
                "-Dhadoop.home.dir=" + HADOOP_HOME,
                "-Dyarn.home.dir=" + HADOOP_HOME,
                "-Dhadoop.log.dir=" + os.path.join(self.workdir, "logs"),
                "-Dyarn.log.dir=" + os.path.join(self.workdir, "logs"),
                "-Dhadoop.log.file=%s.log" % name,
                "-Dhadoop.root.logger=INFO,console",
                "-Djava.io.tmpdir=" + os.path.join(self.workdir, "tmp"),
                "-cp",
                conf_dir + os.pathsep + os.path.join(LIB_DIR, "*"),
                cls,
            ]
        )

    def _spawn(self, name, conf_dir, heap, cls, extra_env=None):
        env = dict(os.environ)
        for k in ("CLASSPATH", "HADOOP_CONF_DIR", "YARN_CONF_DIR"):
            env.pop(k, None)
        env.update(
            {
                "PATH": self._daemon_path,
                "JAVA_HOME": self.java_home,
                "HADOOP_CONF_DIR": conf_dir,
                "HADOOP_HOME": HADOOP_HOME,
                "HADOOP_COMMON_HOME": HADOOP_HOME,
                "HADOOP_YARN_HOME": HADOOP_HOME,
                MARKER_VAR: self.token,
            }
        )
        env.update(extra_env or {})
        log = os.path.join(self.workdir, "logs", name + ".log")
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self._java_cmd(conf_dir, heap, cls, name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        self._procs[proc.pid] = proc
        return proc.pid, log

    def _start_rm(self, wait=True):
        self.rm_pid, self._rm_log = self._spawn("resourcemanager", self.conf_dir, self.rm_heap, RM_CLASS)
        if wait:
            self._wait_rm()

    def _wait_rm(self):
        deadline = time.time() + self.startup_timeout
        while True:
            try:
                info = self.rest("/ws/v1/cluster/info")["clusterInfo"]
                if info.get("state") == "STARTED":
                    return
            except (OSError, ValueError, KeyError, TypeError):
                pass
            if not pid_alive(self.rm_pid):
                raise YarnTestbedError("ResourceManager died:\n" + _tail(self._rm_log))
            if time.time() > deadline:
                raise YarnTestbedError("ResourceManager did not start:\n" + _tail(self._rm_log))
            time.sleep(0.25)

    def _start_nms(self):
        for nm in self.nodemanagers:
            pid, log = self._spawn(
                "nodemanager-%d" % nm["index"],
                nm["conf_dir"],
                self.nm_heap,
                NM_CLASS,
                extra_env={"MPILAUNCH_FAKE_GPUS": str(self.gpus_per_node or 0)},
            )
            nm["pid"] = pid
            nm["log"] = log

    def _wait_nodes(self):
        deadline = time.time() + self.startup_timeout
        # NodeManagers name themselves <canonical host name>:<port>, i.e.
        # localhost:PORT; match them by their web address port instead.
        while True:
            try:
                nodes = self.nodes()
            except (OSError, ValueError):
                nodes = []
            by_port = {n.get("nodeHTTPAddress", "").rsplit(":", 1)[-1]: n for n in nodes if n.get("state") == "RUNNING"}
            found = [by_port.get(nm["http_address"].rsplit(":", 1)[-1]) for nm in self.nodemanagers]
            if all(n is not None and _node_gpus(n) >= (self.gpus_per_node or 0) for n in found):
                for nm, n in zip(self.nodemanagers, found):
                    nm["node_id"] = n["id"]
                    nm["rack"] = n.get("rack")
                return
            for nm in self.nodemanagers:
                if not pid_alive(nm["pid"]):
                    raise YarnTestbedError("NodeManager %d died:\n%s" % (nm["index"], _tail(nm["log"])))
            if time.time() > deadline:
                raise YarnTestbedError(
                    "NodeManagers did not register (have %s):\n%s"
                    % (json.dumps(nodes, indent=1)[:3000], _tail(self.nodemanagers[0]["log"]))
                )
            time.sleep(0.25)

    def _setup_labels(self):
        labeled = [nm for nm in self.nodemanagers if nm["label"]]
        if not self.node_label or not labeled:
            return
        self.rest(
            "/ws/v1/cluster/add-node-labels",
            "POST",
            {"nodeLabelInfo": [{"name": self.node_label, "exclusivity": True}]},
        )
        for nm in labeled:
            self.rest("/ws/v1/cluster/nodes/%s/replace-labels?labels=%s" % (nm["node_id"], self.node_label), "POST", {})
        deadline = time.time() + 30
        while True:
            nodes = {n["id"]: n for n in self.nodes()}
            if all(self.node_label in (nodes[nm["node_id"]].get("nodeLabels") or []) for nm in labeled):
                return
            if time.time() > deadline:
                raise YarnTestbedError("node labels not applied: %s" % json.dumps(nodes)[:2000])
            time.sleep(0.2)

    def stop(self, timeout=4.0, graceful=True):
        """Stop NMs and the RM and kill every process they started.

        graceful: NodeManagers get SIGTERM first (they stop their containers:
        SIGTERM to each container's process group, SIGKILL 250 ms later) and
        SIGKILL to their process group after ``timeout`` s (a NodeManager
        with running applications hangs in shutdown after "Done waiting for
        Applications to be Finished", so this timeout is usually hit then);
        the RM likewise.  Not graceful: SIGKILL right away.
        Then /proc is swept (``sweep()``) for anything still carrying this
        cluster's marker variable (container processes that daemonized out of
        their process group), any process whose cwd is a container dir of
        this cluster, and skein drivers using this cluster's SKEIN_CONFIG;
        all of them get SIGKILL.  Idempotent.
        """
        if not self._started and not self.rm_pid:
            return
        if not graceful:
            timeout = 0
        nm_pids = [nm["pid"] for nm in self.nodemanagers if nm.get("pid")]
        self._terminate(nm_pids, timeout)
        if self.rm_pid:
            self._terminate([self.rm_pid], min(timeout, 3.0))
        self.sweep()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self._started = False
        self.rm_pid = None
        for nm in self.nodemanagers:
            nm["pid"] = None
        if self.workdir and os.path.isdir(self.workdir):
            if self.keep_workdir:
                self._save_state(running=False)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _terminate(self, pids, timeout):
        sig = signal.SIGTERM if timeout > 0 else signal.SIGKILL
        for pid in pids:
            for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
                try:
                    target()
                    break
                except (ProcessLookupError, PermissionError):
                    continue
        deadline = time.time() + timeout
        while time.time() < deadline and any(self._alive(p) for p in pids):
            time.sleep(0.1)
        for pid in pids:
            for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    target()
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in pids:
            self._reap(pid)

    def _alive(self, pid):
        proc = self._procs.get(pid)
        if proc is not None:
            return proc.poll() is None
        return pid_alive(pid)

    def _reap(self, pid):
        proc = self._procs.get(pid)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def leftover_processes(self):
        """PIDs (with cmdlines) that belong to this cluster and are alive."""
        mine = _ancestors()
        skein_conf = os.path.join(self.workdir or "/nonexistent", "skein")
        # container working dirs live under <workdir>/nmN/local
        wd = os.path.join(self.workdir or "/nonexistent", "nm")
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in mine or not pid_alive(pid):
                continue
            env = proc_environ(pid)
            hit = env.get(MARKER_VAR) == self.token
            if not hit:
                try:
                    cwd = os.readlink("/proc/%d/cwd" % pid)
                    hit = cwd.startswith(wd)
                except OSError:
                    pass
            cmd = None
            if not hit and env.get("SKEIN_CONFIG") == skein_conf:
                cmd = _proc_cmdline(pid)
                hit = "com.anaconda.skein.Driver" in cmd
            if hit:
                found[pid] = cmd if cmd is not None else _proc_cmdline(pid)
        return found

    def sweep(self, rounds=20):
        """SIGKILL every leftover process of this cluster; returns what was killed."""
        killed = {}
        for _ in range(rounds):
            left = self.leftover_processes()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self._reap(pid)
            killed.update(left)
            time.sleep(0.1)
        return killed

    # -- state file / CLI support ----------------------------------------

    def _save_state(self, running=True):
        state = {
            "running": running,
            "workdir": self.workdir,
            "token": self.token,
            "conf_dir": self.conf_dir,
            "rm_address": self.rm_address,
            "rm_webapp_url": self.rm_webapp_url,
            "rm_pid": self.rm_pid,
            "env": self.env,
            "nodemanagers": self.nodemanagers,
            "node_label": self.node_label,
            "queues": self.queues,
            "java_home": self.java_home,
            "hadoop_version": HADOOP_VERSION,
        }
        tmp = os.path.join(self.workdir, STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, os.path.join(self.workdir, STATE_FILE))

    @classmethod
    def attach(cls, workdir):
        """Re-create a handle for a cluster started elsewhere (``up``)."""
        with open(os.path.join(workdir, STATE_FILE)) as f:
            st = json.load(f)
        self = cls(
            workdir=st["workdir"],
            num_nodemanagers=len(st["nodemanagers"]),
            node_label=st["node_label"],
            java_home=st["java_home"],
            keep_workdir=True,
        )
        self.token = st["token"]
        self.conf_dir = st["conf_dir"]
        self.rm_address = st["rm_address"]
        self.rm_webapp_url = st["rm_webapp_url"]
        self.rm_pid = st["rm_pid"]
        self.env = st["env"]
        self.nodemanagers = st["nodemanagers"]
        self.queues = st["queues"]
        self._started = bool(st.get("running"))
        return self

    # -- REST helpers -----------------------------------------------------

    def rest(self, path, method="GET", body=None, timeout=10):
        """JSON from the RM REST API (path like '/ws/v1/cluster/nodes')."""
        return _http(method, self.rm_webapp_url + path, body, timeout=timeout)

    def nm_rest(self, nm, path, timeout=10):
        """JSON from a NodeManager's REST API (nm: dict or index)."""
        if isinstance(nm, int):
            nm = self.nodemanagers[nm]
        return _http("GET", nm["web_url"] + path, timeout=timeout)

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
                    text = _tail(os.path.join(cdir, name), lines)
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


def _node_gpus(node):
    res = (node.get("totalResource") or {}).get("resourceInformations") or {}
    for ri in res.get("resourceInformation") or []:
        if ri.get("name") == "yarn.io/gpu":
            return int(ri.get("value") or 0)
    return 0


def resource_value(resource, name):
    """Value of resource ``name`` ('memory-mb', 'vcores', 'yarn.io/gpu') in a
    REST resource dict: either the node/partition form
    {"resourceInformations": {"resourceInformation": [{"name", "value"}...]}}
    or the container form {"entry": [{"key", "value"}...]}."""
    resource = resource or {}
    for ri in (resource.get("resourceInformations") or {}).get("resourceInformation") or []:
        if ri.get("name") == name:
            return int(ri.get("value") or 0)
    for e in resource.get("entry") or []:
        if e.get("key") == name:
            return int(e.get("value") or 0)
    return 0


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")


# --------------------------------------------------------------------------
# CLI


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m testbeds.yarn.cluster")
    ap.add_argument("command", choices=["up", "down", "status", "env", "fetch"])
    ap.add_argument("--workdir", default=DEFAULT_CLI_WORKDIR)
    ap.add_argument("--nodemanagers", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=4, help="fake GPUs per NodeManager")
    ap.add_argument("--memory-mb", type=int, default=8192)
    ap.add_argument("--vcores", type=int, default=8)
    args = ap.parse_args(argv)
    state = os.path.join(args.workdir, STATE_FILE)

    if args.command == "fetch":
        print(ensure_installed(quiet=False))
        return 0
    if args.command == "up":
        if os.path.exists(state):
            old = YarnCluster.attach(args.workdir)
            if old._started and pid_alive(old.rm_pid or 0):
                sys.stderr.write("already up (workdir %s)\n" % args.workdir)
                sys.stdout.write(old.shell_exports())
                return 0
            old.stop()
        if os.path.isdir(args.workdir):
            shutil.rmtree(args.workdir)
        t0 = time.time()
        yc = YarnCluster(
            workdir=args.workdir,
            num_nodemanagers=args.nodemanagers,
            gpus_per_node=args.gpus,
            memory_mb=args.memory_mb,
            vcores=args.vcores,
            keep_workdir=True,
        )
        yc.start()
        sys.stderr.write(
            "YARN up in %.1fs: RM %s, web %s, %d NMs, workdir %s\n"
            % (time.time() - t0, yc.rm_address, yc.rm_webapp_url, len(yc.nodemanagers), yc.workdir)
        )
        sys.stdout.write(yc.shell_exports())
        return 0
    if not os.path.exists(state):
        sys.stderr.write("no cluster state in %s\n" % args.workdir)
        return 1
    yc = YarnCluster.attach(args.workdir)
    if args.command == "env":
        sys.stdout.write(yc.shell_exports())
        return 0
    if args.command == "status":
        up = yc._started and pid_alive(yc.rm_pid or 0)
        print("workdir:   %s" % yc.workdir)
        print("rm:        %s  (pid %s, %s)" % (yc.rm_address, yc.rm_pid, "alive" if up else "down"))
        print("webapp:    %s" % yc.rm_webapp_url)
        if up:
            try:
                for n in yc.nodes():
                    print(
                        "node:      %-18s %-8s labels=%s mem=%s vcores=%s gpu=%s used=%s"
                        % (
                            n["id"],
                            n["state"],
                            ",".join(n.get("nodeLabels") or []) or "-",
                            resource_value(n.get("totalResource"), "memory-mb"),
                            resource_value(n.get("totalResource"), "vcores"),
                            resource_value(n.get("totalResource"), "yarn.io/gpu"),
                            resource_value(n.get("usedResource"), "yarn.io/gpu"),
                        )
                    )
                for a in yc.apps():
                    print("app:       %s %s/%s queue=%s" % (a["id"], a["state"], a["finalStatus"], a["queue"]))
            except (OSError, ValueError) as e:
                print("REST error: %s" % e)
        return 0 if up else 3
    if args.command == "down":
        yc._started = True
        killed_before = yc.leftover_processes()
        yc.keep_workdir = False
        yc.stop()
        sys.stderr.write("down: stopped %d processes, removed %s\n" % (len(killed_before), args.workdir))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
