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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from ..procs import pid_alive
from .config import YarnConfig
from .hadoop import (
    DEFAULT_CLI_WORKDIR,
    HADOOP_HOME,
    HADOOP_VERSION,
    JPMS_OPTS,
    JVM_TUNING,
    LIB_DIR,
    MARKER_VAR,
    NM_CLASS,
    RM_CLASS,
    STATE_FILE,
    YarnTestbedError,
    ancestors,
    ensure_installed,
    find_java_home,
    node_gpus,
    proc_cmdline,
    proc_environ,
    resource_value,
    tail,
)
from .rest import YarnRest


class YarnCluster(YarnConfig, YarnRest):
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
                raise YarnTestbedError("ResourceManager died:\n" + tail(self._rm_log))
            if time.time() > deadline:
                raise YarnTestbedError("ResourceManager did not start:\n" + tail(self._rm_log))
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
            if all(n is not None and node_gpus(n) >= (self.gpus_per_node or 0) for n in found):
                for nm, n in zip(self.nodemanagers, found):
                    nm["node_id"] = n["id"]
                    nm["rack"] = n.get("rack")
                return
            for nm in self.nodemanagers:
                if not pid_alive(nm["pid"]):
                    raise YarnTestbedError("NodeManager %d died:\n%s" % (nm["index"], tail(nm["log"])))
            if time.time() > deadline:
                raise YarnTestbedError(
                    "NodeManagers did not register (have %s):\n%s"
                    % (json.dumps(nodes, indent=1)[:3000], tail(self.nodemanagers[0]["log"]))
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
        mine = ancestors()
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
                cmd = proc_cmdline(pid)
                hit = "com.anaconda.skein.Driver" in cmd
            if hit:
                found[pid] = cmd if cmd is not None else proc_cmdline(pid)
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
