"""Waiting for a key of the application's key-value store by asking for it, not by skein's ``kv.wait``.

``kv.wait`` subscribes to the store's events over a gRPC stream and waits for the
ApplicationMaster to confirm the subscription. In a launcher container that had just
waited for one key that way, the second ``kv.wait`` sometimes never returned: py-spy found
it in ``KeyValueStore._add_subscription`` (skein's kv module), on a confirmation that did not come,
while the key was already in the store (twice: a bench run, 2026-12-07, and CI's
``test_torch_env_yarn_gloo_allreduce_4_ranks_in_2_containers[cluster]`` the same day, which then
hung until its 240 s limit). A plain ``kv.get`` each poll has no subscription to lose; the
first polls come 20 ms apart, so a key that is on its way costs no more than the
subscription did.
"""

from __future__ import annotations

import time

FIRST_POLL_S = 0.02
MAX_POLL_S = 0.25


def wait_key(kv, key: str, max_poll_s: float = MAX_POLL_S, sleep=time.sleep) -> bytes:
    """The value of ``key`` once it is there (``kv``: a skein KeyValueStore, or anything with ``get``)."""
    poll = FIRST_POLL_S
    while True:
        value = kv.get(key)
        if value is not None:
            return value
        sleep(poll)
        poll = min(poll * 2, max_poll_s)
