"""The testbed's patched kwok: what a command exec'd into a kwok pod inherits."""

from __future__ import annotations

import signal
import threading

import pytest

from support.mpi_installs import require

pytestmark = pytest.mark.k8s


def test_execd_commands_start_with_no_signal_blocked_even_if_kwok_did():
    """kwok started by a thread that blocks every signal (its children inherit
    that mask): commands it execs must still start with nothing blocked, or
    MPI daemons exec'd that way miss SIGCHLD/SIGTERM (kwok-v0.8.0-exec.patch)."""
    try:
        from testbeds.k8s.cluster import KubeCluster
    except ImportError as e:
        require(f"Kubernetes testbed not importable: {e}")
    result: dict = {}

    def start_blocked():
        signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})
        c = KubeCluster()
        try:
            c.start()
            c.create_nodes(1, gpus=0, prefix="mask")
            etcd = open(f"/proc/{c.pids['etcd']}/status").read().split("SigBlk:")[1].split()[0]
            c.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "mask-probe"},
                    "spec": {"containers": [{"name": "c", "image": "none"}]},
                }
            )
            c.wait_pods(count=1, timeout=60)
            out = c.kubectl("exec", "mask-probe", "--", "sh", "-c", "grep SigBlk /proc/self/status").stdout
            result.update(execd=out.split()[1], etcd=etcd)
        except Exception as e:  # reported below, in the test's thread
            result["error"] = e
        finally:
            c.stop()

    t = threading.Thread(target=start_blocked)
    t.start()
    t.join(timeout=240)
    if "error" in result:
        raise result["error"]
    # an unpatched Go program of the testbed keeps (most of) the inherited mask
    assert int(result["etcd"], 16) != 0, "the testbed's processes did inherit the mask"
    assert result["execd"] == "0000000000000000"
