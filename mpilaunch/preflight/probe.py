"""The preflight probe: sent as text to each worker (``python3 -c``), stdlib only, one JSON line out.

It reports what this worker has, not what is good: the judging is done on the
submitting side, against the plan and the other workers (``checks.py``).

- ``gpus``: what ``nvidia-smi`` lists (index, name, uncorrected volatile ECC
  errors, the active clock-throttle reasons as a bit mask); ``null`` where the
  worker has no ``nvidia-smi``.
- ``scratch``: the directory ranks write temporary files to (``TMPDIR``, else
  /tmp) and its free bytes.
- ``kernel_s``: the best of three runs of a fixed piece of CPU work (hashing
  and pure-Python arithmetic), in wall seconds: a throttled or oversubscribed
  worker is slower than its peers at it.
- ``clock``: this worker's wall clock, read last, just before the answer is
  written (the asking side compares it with its own on receipt).
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

# the query nvidia-smi answers per GPU (ECC: the volatile, uncorrected count since the driver loaded)
GPU_FIELDS = "index,name,ecc.errors.uncorrected.volatile.total,clocks_throttle_reasons.active"


def number(text):
    """nvidia-smi's field as a number; None for "[N/A]", "[Not Supported]" and the like."""
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(float(text))
    except ValueError:
        return None


def gpus(timeout):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], "nvidia-smi did not answer: %s" % (e,)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        return [], "nvidia-smi exited %d%s" % (done.returncode, ": " + tail[-1][:200] if tail else "")
    found = []
    for line in done.stdout.decode(errors="replace").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not cells[0]:
            continue
        cells += [""] * (4 - len(cells))  # a driver that answers fewer fields: those are unknown
        found.append(
            {"index": number(cells[0]), "name": cells[1], "ecc": number(cells[2]), "throttle": number(cells[3])}
        )
    return visible_only(found, os.environ.get("CUDA_VISIBLE_DEVICES")), None


def visible_only(found, visible):
    """The GPUs this worker was given: nvidia-smi lists the whole machine's where it is shared (local,
    YARN), the worker's agent has CUDA_VISIBLE_DEVICES (ids; UUIDs and MIG names: not filtered)."""
    if visible is None:
        return found
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in wanted):
        return found
    return [gpu for gpu in found if str(gpu["index"]) in wanted]


def kernel_seconds(rounds=3, mib=8):
    """The best of ``rounds`` runs of the fixed work: best-of, so one preempted run is not a slow worker."""
    block = bytes(range(256)) * 4096  # 1 MiB
    best = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        digest = hashlib.sha256()
        for _ in range(mib):
            digest.update(block)
        total = 0
        for i in range(100000):
            total += i * i % 7
        took = time.perf_counter() - t0
        best = took if best is None else min(best, took)
    return best


def scratch():
    where = os.environ.get("TMPDIR") or "/tmp"
    try:
        return where, shutil.disk_usage(where).free, None
    except OSError as e:
        return where, None, str(e)


def main(argv):
    budget = float(argv[argv.index("--budget") + 1]) if "--budget" in argv else 10.0
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3  # a second look: more
    answer = {"host": socket.gethostname()}
    answer["gpus"], answer["gpu_error"] = gpus(max(1.0, budget / 2))
    answer["scratch"], answer["scratch_free"], answer["scratch_error"] = scratch()
    answer["kernel_s"] = kernel_seconds(rounds)
    answer["clock"] = time.time()
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
