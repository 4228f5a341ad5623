"""Following the launcher container of an attached job from the submitting side (``--launcher cluster``).

Its launch description goes into skein's key-value store; mpirun's output comes back in chunks
through it and is fed to the mpirun workload's rank-output parser, so status lines, fail fast,
``--timeout`` and Ctrl-C behave as with ``--launcher local``; its exit code is a key too.
"""

from __future__ import annotations

import json
import time

import skein

from ...core import launcher_lines, mpi
from ...core.exit_codes import EXIT_FAILED
from . import keys as launcher_keys
from .client import shorten, state_name
from .keys import KV_PREFIX

FAIL_FAST_GRACE_S = 5.0  # as workloads/mpirun.py's: mpirun gets this long to end the job after a rank failed


def run_launcher(backend, output, deadline: float | None) -> int | None:
    """Start the launcher container, feed its mpirun output to ``output``, return mpirun's code.

    None when ``deadline`` passed first (the workload reports the timeout).
    """
    kv = backend.app.kv
    backend.put_launch()
    failed_at = None
    relaunched = backend.launcher_swaps.count
    stop_sent = False
    next_check = 0.0
    while True:
        try:
            code = kv.get(KV_PREFIX + launcher_keys.EXIT_KEY)
            drain_output(backend, output)
        except (skein.exceptions.SkeinError, ConnectionError, OSError) as e:
            # The ApplicationMaster is gone (`mpilaunch delete`, yarn application -kill).
            try:
                state = state_name(backend.app_report().state)
            except Exception:
                state = "unknown"
            output.feed(
                "stderr",
                f"mpilaunch: lost the YARN application {backend.app_id} ({state}) "
                f"while mpirun ran: {shorten(str(e), 200)}\n",
            )
            return EXIT_FAILED
        if code is not None:
            backend.refresh_launcher()
            return int(code)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None
        try:
            if not backend.launcher_info:
                info = kv.get(KV_PREFIX + launcher_keys.INFO_KEY)
                if info is not None:
                    backend.launcher_info = json.loads(info)
                    # the launcher container's mpirun tags the ranks' lines
                    output.ompi_tag_space = mpi.tag_has_space(
                        mpi.MpiInfo(
                            backend.launcher_info.get("flavour", ""), str(backend.launcher_info.get("version", "")), ""
                        )
                    )
            if relaunched != backend.launcher_swaps.count:  # it ran mpirun again itself (a spare)
                relaunched, failed_at = backend.launcher_swaps.count, None
            if not stop_sent:
                if failed_at is None and any(c != 0 for _, _, c in output.statuses):
                    failed_at = now
                # mpirun did not end the job itself (hydra waits for every rank),
                # or ranks run elsewhere than planned, or a worker was lost
                if (failed_at is not None and now - failed_at > FAIL_FAST_GRACE_S) or output.abandoned():
                    kv[KV_PREFIX + launcher_keys.STOP_KEY] = b"1"
                    stop_sent = True
        except (skein.exceptions.SkeinError, ConnectionError, OSError):
            pass  # the next round's kv.get tells
        if now >= next_check:
            next_check = now + 1.0
            state = backend.refresh_launcher()
            if state in ("FAILED", "KILLED", "SUCCEEDED") and kv.get(KV_PREFIX + launcher_keys.EXIT_KEY) is None:
                drain_output(backend, output)
                c = backend.launcher_container
                output.feed(
                    "stderr",
                    f"mpilaunch: launcher container {c.get('container')} on {c.get('node')} "
                    f"ended ({state}) without reporting mpirun's exit: "
                    f"{shorten(c.get('exit')) or 'no exit message'}\n",
                )
                return EXIT_FAILED
        time.sleep(0.1)


def drain_output(backend, output) -> None:
    kv = backend.app.kv
    prefix = KV_PREFIX + launcher_keys.OUT_KEY
    chunks = kv.get_prefix(prefix)
    keys = sorted(k for k in chunks if k > backend.out_last)
    for key in keys:
        for stream, line in json.loads(chunks[key]):
            if line.startswith(launcher_lines.SWAP_PREFIX):  # a spare it swapped in: bookkeeping, not output
                backend.launcher_swapped(output, line)
            elif line.startswith(launcher_lines.NOTES):  # the launcher's own lines: not mpirun's output
                output.note(line)
            else:
                output.feed(stream, line)
    if keys:
        backend.out_last = keys[-1]
        kv.discard_range(prefix, keys[-1] + "\0")
