"""The real node's configuration files and iptables rules, pure functions of their inputs
(:mod:`testbeds.k8s.node` writes and applies them). Stdlib only.
"""

from __future__ import annotations

import ipaddress
import os
import textwrap
from pathlib import Path

REAL_KEY = "mpilaunch.testbed/real-pods"
POD_SUBNET = os.environ.get("MPILAUNCH_K8S_POD_SUBNET", "10.233.0.0/24")
CNI_BIN = "/usr/lib/cni"
PAUSE_IMAGE = "mpilaunch.local/pause:1"


def gateway(subnet: str = POD_SUBNET) -> str:
    return str(next(ipaddress.ip_network(subnet).hosts()))


def containerd_config(root: Path, state: Path, sock: Path, cni_conf: Path) -> str:
    return textwrap.dedent(f"""\
        version = 2
        root = "{root}"
        state = "{state}"
        # only what the CRI needs: no /opt plugin dir, no other snapshotters
        disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
          "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
          "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
        [grpc]
          address = "{sock}"
        [ttrpc]
          address = "{sock}.ttrpc"
        [debug]
          address = ""
        [metrics]
          address = ""
        [plugins."io.containerd.grpc.v1.cri"]
          sandbox_image = "{PAUSE_IMAGE}"
          # no CAP_SYS_RESOURCE on these machines: the sandbox's oom_score_adj
          # of -998 otherwise makes runc fail ("can't get final child's PID")
          restrict_oom_score_adj = true
          enable_selinux = false
          [plugins."io.containerd.grpc.v1.cri".containerd]
            snapshotter = "overlayfs"
            default_runtime_name = "runc"
            [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
              runtime_type = "io.containerd.runc.v2"
              [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
                SystemdCgroup = false
          [plugins."io.containerd.grpc.v1.cri".cni]
            bin_dir = "{CNI_BIN}"
            conf_dir = "{cni_conf}"
            max_conf_num = 1
          [plugins."io.containerd.grpc.v1.cri".registry]
            config_path = ""
        """)


def cni_config(subnet: str, bridge: str, ipam_dir: Path, service_cidr: str) -> dict:
    # No ipMasq and no default route: a pod reaches its bridge and, through
    # the gateway, the service range (the API server's DNAT); nothing else.
    return {
        "cniVersion": "1.0.0",
        "name": "mpilaunch-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": subnet, "gateway": gateway(subnet)}]],
                    "routes": [{"dst": service_cidr}],
                },
            }
        ],
    }


def kubelet_config(
    *, ca: Path, sock: Path, node_ip: str, port: int, healthz_port: int, resolv: Path, pod_logs: Path, plugins: Path
) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{sock}",
        # field notes: what a kubelet needs on these machines
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        # Without pod cgroups (above) kubelet v1.33's in-place resize dereferences the nil pod
        # cgroup config and the kubelet dies (kubernetes #137993): seen here when it logged
        # "Missing actuated resource record" for a Volcano probe pod, and every real-pods test
        # after it failed. No test resizes a pod; the resize path is turned off.
        "featureGates": {"InPlacePodVerticalScaling": False},
        "failSwapOn": False,
        "clusterDNS": [node_ip],
        "clusterDomain": "cluster.local",
        "resolvConf": str(resolv),
        "podLogsDir": str(pod_logs),
        "volumePluginDir": str(plugins),
        # the project's image is imported, never pulled: image GC must not drop it
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "registerWithTaints": [{"key": REAL_KEY, "value": "true", "effect": "NoSchedule"}],
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "60s",
        "maxPods": 64,
        "staticPodPath": "",
    }


def corefile(node_ip: str, kubeconfig: Path, health_port: int, ready_port: int) -> str:
    # Only cluster.local (and reverse lookups of it): no forwarding, so pods
    # reach no resolver beyond the testbed.
    return textwrap.dedent(f"""\
        .:53 {{
            bind {node_ip}
            errors
            health 127.0.0.1:{health_port}
            ready 127.0.0.1:{ready_port}
            kubernetes cluster.local in-addr.arpa ip6.arpa {{
                kubeconfig {kubeconfig}
                pods insecure
                ttl 5
            }}
        }}
        """)


def testbed_rules_on(rules: list[str], bridge: str) -> list[str]:
    """The lines of `iptables -S` output that are testbed DNAT rules on `bridge`."""
    return [
        line for line in rules if line.startswith("-A ") and "mpilaunch-testbed-" in line and f"-i {bridge} " in line
    ]


def dnat_rule(bridge: str, service_ip: str, apiserver_port: int, comment: str) -> list[str]:
    return [
        "PREROUTING",
        "-i",
        bridge,
        "-d",
        f"{service_ip}/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{apiserver_port}",
    ]
