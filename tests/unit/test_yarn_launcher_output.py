"""The YARN launcher's output chunks (``backends/yarn/in_cluster/launcher.py``, ``Streamer``): a put into the
key-value store that fails loses no line, and the lines reach the submitting side in order.

The store here is a dict that refuses its first puts. A transient failure of skein's key-value
store (its application master not answering for a moment) cannot be made on demand on the real
YARN testbed; what is under test is the Streamer's own numbering and retrying.
"""

from __future__ import annotations

import json
import time

from mpilaunch.backends.yarn.in_cluster.launcher import CHUNK_BYTES, Streamer
from mpilaunch.backends.yarn.keys import OUT_KEY


class FlakyStore(dict):
    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures

    def __setitem__(self, key, value):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Unable to connect to application master")  # what skein raises
        super().__setitem__(key, value)


def lines(store) -> list[str]:
    """What the submitting side reads: every chunk, in key order (backends/yarn/backend.py)."""
    return [line for key in sorted(store) for _, line in json.loads(store[key])]


def stopped_streamer(store) -> Streamer:
    """A Streamer whose flusher thread has ended: the test flushes."""
    streamer = Streamer(store, "p/")
    streamer.done.set()
    streamer.flusher.join()
    return streamer


def test_a_failed_put_keeps_its_lines_and_its_chunk_number():
    store = FlakyStore(failures=2)
    streamer = stopped_streamer(store)
    for line in ("a\n", "b\n", "c\n"):
        streamer.add("stdout", line)
        try:
            streamer.flush()
        except ConnectionError:
            pass
    streamer.add("stderr", "d\n")
    streamer.flush()
    assert lines(store) == ["a\n", "b\n", "c\n", "d\n"]
    assert sorted(store) == [f"p/{OUT_KEY}0000000000", f"p/{OUT_KEY}0000000001"]  # no gap: none skipped
    assert streamer.pending == [] and streamer.size == 0


def test_the_flusher_tries_again_and_says_so_in_the_container_log(capfd):
    store = FlakyStore(failures=3)
    streamer = Streamer(store, "p/")
    streamer.add("stdout", "rank 0 started\n")
    deadline = time.monotonic() + 10
    while not store and time.monotonic() < deadline:
        time.sleep(0.02)
    streamer.close()
    assert lines(store) == ["rank 0 started\n"]
    log = capfd.readouterr().err.splitlines()
    assert len([m for m in log if "could not be put into the key-value store" in m]) == 1, log
    assert len([m for m in log if "is put into the key-value store again" in m]) == 1, log


def test_a_big_line_whose_put_fails_does_not_end_the_reading_thread():
    """add() runs in the thread that reads mpirun's pipe: an exception there would stop the reading,
    and mpirun would block on a full pipe."""
    store = FlakyStore(failures=1)
    streamer = stopped_streamer(store)
    streamer.add("stdout", "x" * CHUNK_BYTES + "\n")  # a full chunk: flushed at once, and refused
    assert store == {}
    streamer.add("stdout", "next\n")
    streamer.flush()
    assert lines(store) == ["x" * CHUNK_BYTES + "\n", "next\n"]


def test_close_tries_the_last_lines_again_then_says_they_are_lost(capfd):
    kept = FlakyStore(failures=2)
    streamer = Streamer(kept, "p/")
    streamer.done.set()
    streamer.flusher.join()
    streamer.add("stdout", "last\n")
    streamer.close(tries=3, pause_s=0.01)
    assert lines(kept) == ["last\n"]

    lost = FlakyStore(failures=100)
    streamer = stopped_streamer(lost)
    streamer.add("stdout", "never\n")
    streamer.close(tries=2, pause_s=0.01)  # no exception: the exit code is put after it
    assert lost == {}
    assert "it is lost" in capfd.readouterr().err
