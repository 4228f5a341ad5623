"""The Hadoop install the YARN testbed runs (fetched, cached) and the helpers its cluster uses
(configuration files, the REST API, processes). Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from xml.sax.saxutils import escape

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


def write_xml(path, props):
    lines = ['<?xml version="1.0"?>', "<configuration>"]
    for k, v in props.items():
        lines.append("  <property><name>%s</name><value>%s</value></property>" % (escape(k), escape(str(v))))
    lines.append("</configuration>\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def http(method, url, body=None, content_type="application/json", timeout=10):
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


def ancestors():
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


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log at %s)" % path


# --------------------------------------------------------------------------
# the cluster


def node_gpus(node):
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


def user_name():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")


# --------------------------------------------------------------------------
# CLI
