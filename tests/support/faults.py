"""Faults made real on this machine, for the preflight, spare and straggler tests (issue 52, item 4).

- ``slow_cpu``: a slow worker. The processes given (and everything they start from then on) are
  moved into a cgroup of their own whose CPU quota is a fraction of one core: cgroup v2's
  ``cpu.max`` where the unified hierarchy has the cpu controller, else cgroup v1's
  ``cpu.cfs_quota_us`` (this machine mounts a hybrid hierarchy: cpu is a v1 controller). An ssh
  testbed host is slowed by its listening sshd, from which every session is forked.
- ``slow_link``: a slow network link. A token bucket (``tc qdisc ... tbf``: this machine's kernel
  has no ``netem``) on both ends of an ssh testbed host's veth limits what the host sends and
  receives to a rate, as a port that negotiated a lower speed does.
Needs root; the cgroup and the queueing disciplines are removed on the way out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

PERIOD_US = 100_000


def cpu_cgroup_root() -> tuple[Path, str]:
    """(where to make a cgroup, "v2" or "v1") for the cpu controller of this machine."""
    for unified in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = unified / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return unified, "v2"
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, "v1"
    raise RuntimeError("no cpu cgroup controller on this machine (neither cgroup v2 cpu.max nor v1 cpu)")


def _cgroup_of(pid: int, root: Path, version: str) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == "v2" and controllers == "") or (version == "v1" and "cpu" in controllers.split(",")):
            return root / path.lstrip("/")
    return root


@contextlib.contextmanager
def slow_cpu(pids: list[int], share_of_a_core: float = 0.05):
    """Run ``pids`` (and what they start while inside) at ``share_of_a_core`` of one CPU."""
    root, version = cpu_cgroup_root()
    group = root / f"mpilaunch-test-slow-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    quota = max(1000, int(PERIOD_US * share_of_a_core))
    if version == "v2":
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    before = {pid: _cgroup_of(pid, root, version) for pid in pids}
    try:
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        left = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        for pid in left:  # the given ones back where they were, anything they started to the root
            with contextlib.suppress(OSError):
                (before.get(pid, root) / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            os.rmdir(group)


@contextlib.contextmanager
def slow_link(bed, host: str, rate: str = "20mbit"):
    """Limit the ssh testbed ``host``'s traffic, both ways, to ``rate`` (tc's units: ``20mbit``)."""
    outside, inside = bed.link(host)
    shape = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    ends = [[], ["ip", "netns", "exec", bed.netns(host)]]
    devices = [outside, inside]
    try:
        for prefix, device in zip(ends, devices):
            subprocess.run(
                [*prefix, "tc", "qdisc", "add", "dev", device, "root", *shape], check=True, capture_output=True
            )
        yield
    finally:
        for prefix, device in zip(ends, devices):
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", device, "root"], capture_output=True)
