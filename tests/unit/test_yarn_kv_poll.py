"""yarn/kv_poll.py: a key waited for by polling the store (skein's kv.wait lost a subscription in CI)."""

from mpilaunch.backends.yarn.kv_poll import MAX_POLL_S, wait_key


class Store:
    """A key-value store whose key appears after ``appears_after`` gets (the real store: skein's)."""

    def __init__(self, appears_after: int):
        self.gets, self.appears_after = 0, appears_after

    def get(self, key):
        self.gets += 1
        return b"value of " + key.encode() if self.gets > self.appears_after else None


def test_yarn_kv_poll_returns_the_value_once_it_is_there_polling_faster_at_first():
    store, slept = Store(appears_after=8), []
    assert wait_key(store, "mpilaunch/secret", sleep=slept.append) == b"value of mpilaunch/secret"
    assert store.gets == 9 and len(slept) == 8
    assert slept[0] < 0.05 and slept == sorted(slept) and max(slept) == MAX_POLL_S


def test_yarn_kv_poll_a_key_already_there_is_one_get_and_no_sleep():
    store, slept = Store(appears_after=0), []
    assert wait_key(store, "k", sleep=slept.append) == b"value of k" and (store.gets, slept) == (1, [])
