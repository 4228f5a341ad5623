"""A scripted fake backend for the lifecycle harness (tests/lifecycle): no cluster, no processes.

``FakeBackend`` implements exactly the required surface of a backend
(``mpilaunch.backends.base.BaseBackend``: nothing of ``backends/protocols.py``)
the way the local backend does (transport ``agent``, a secret file in the run
directory, one ``host:port`` per worker) and records every hook call, in order,
in a ``CallLog`` it shares with the fake workload (``support.fake_workload``).
``FakeClusterBackend`` adds the two optional protocols the retries need:
``ReplacesWorkers`` (``replace_workers``) and ``ClusterLauncher``
(``relaunch``; a launcher in the cluster where ``launcher_in_cluster=True``).

A ``Script`` says what a hook does on its n-th call: raise an exception, send
this process a real signal (``signal.raise_signal``: the lifecycle's own
handlers see it, as they see a Ctrl-C), or run a callable whose value the hook
returns::

    Script(wait_ready=AllocationError("no nodes"))        # the first call raises
    Script(wait_ready={2: signal.SIGINT})                 # the second call gets a Ctrl-C
    Script(job_finished=lambda: "final status: FAILED")   # the text job_finished returns

A worker is lost when the fake workload says so (``FakeBackend.lose``); from
then on ``lost_workers`` reports it, until ``replace_workers`` replaces it.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter

from mpilaunch.backends import base, protocols

BASE_PORT = 41000  # fake agent addresses: never connected to


class CallLog:
    """Every hook call of the fakes, in order: ``(hook, args)``."""

    def __init__(self):
        self.entries: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()  # the lost-worker watch calls hooks from its own thread

    def add(self, hook: str, *args) -> None:
        with self._lock:
            self.entries.append((hook, args))

    def names(self, skip: tuple[str, ...] = ()) -> list[str]:
        return [hook for hook, _ in list(self.entries) if hook not in skip]

    def count(self, hook: str) -> int:
        return self.names().count(hook)

    def args(self, hook: str) -> list[tuple]:
        return [args for name, args in list(self.entries) if name == hook]

    def between(self, first: tuple[str, int], last: tuple[str, int], skip: tuple[str, ...] = ()) -> list[str]:
        """The hooks called after the n-th call of one hook and up to the m-th of another:
        ``between(("watch", 1), ("start", 2))``."""
        names = self.names()

        def index(hook: str, n: int) -> int:
            positions = [i for i, name in enumerate(names) if name == hook]
            assert len(positions) >= n, f"{hook} was called {len(positions)} times, not {n}: {names}"
            return positions[n - 1]

        return [name for name in names[index(*first) + 1 : index(*last) + 1] if name not in skip]


def perform(action):
    """Do one scripted action; a callable's value is what the hook returns."""
    if action is None:
        return None
    if isinstance(action, BaseException):
        raise action
    if isinstance(action, signal.Signals):
        signal.raise_signal(action)  # the handler in place runs now, in this (the main) thread
        return None
    return action()


class Script:
    """hook name -> action on its first call, or {call number: action}."""

    def __init__(self, **hooks):
        self.hooks = {hook: (action if isinstance(action, dict) else {1: action}) for hook, action in hooks.items()}
        self.calls: Counter = Counter()
        self._lock = threading.Lock()

    def act(self, hook: str):
        with self._lock:
            self.calls[hook] += 1
            action = self.hooks.get(hook, {}).get(self.calls[hook])
        return perform(action)


class FakeBackend(base.BaseBackend):
    """A backend whose workers are names: every hook is logged, then does what the script says.
    The required surface only: no optional protocol, no capability."""

    name = "fake"

    def __init__(self, spec, plan, rundir, *, log: CallLog | None = None, script: Script | None = None):
        super().__init__(spec, plan, rundir)
        self.log = log if log is not None else CallLog()
        self.script = script or Script()
        self.secret_file = rundir / "secret"
        self.gone: dict[str, str] = {}  # worker -> why it is lost (FakeBackend.lose)
        self.settle_only: set[str] = set()  # lost workers the watch's questions do not see yet
        self.generation = {w.name: 0 for w in plan.workers}  # a replaced worker gets a new address
        self.polls = 0  # lost_workers(settle=False): the watch thread's questions, not logged

    def _hook(self, hook: str, *args):
        self.log.add(hook, *args)
        return self.script.act(hook)

    def allocate(self) -> None:
        self._hook("allocate")
        self.secret_file.write_text("0" * 64)

    def wait_ready(self, deadline: float, progress) -> None:
        self._hook("wait_ready", deadline)
        progress(len(self.plan.workers), len(self.plan.workers))

    def address(self, worker: str) -> str:
        index = [w.name for w in self.plan.workers].index(worker)
        return f"127.0.0.1:{BASE_PORT + 100 * self.generation[worker] + index}"

    def exec_context(self) -> dict:
        self._hook("exec_context")
        return {
            "transport": "agent",
            "secret_file": str(self.secret_file),
            "forward_env": [],
            "cwd": None,
            "workers": {w.name: {"address": self.address(w.name)} for w in self.plan.workers},
        }

    def lose(self, worker: str, reason: str, settle_only: bool = False) -> None:
        """The worker disappears (said by the fake workload, while it runs). ``settle_only``: only
        the question after a failure (``settle=True``) sees it, as a cluster that catches up late."""
        self.gone[worker] = reason
        if settle_only:
            self.settle_only.add(worker)

    def lost_workers(self, settle: bool = False) -> dict[str, str]:
        if settle:
            self.log.add("lost_workers", settle)
        else:
            self.polls += 1
        self.script.act("lost_workers")
        return {name: why for name, why in self.gone.items() if settle or name not in self.settle_only}

    def job_finished(self, exit_code: int, failure: str | None) -> str | None:
        return self._hook("job_finished", exit_code, failure)

    def describe_workers(self) -> dict[str, dict]:
        self._hook("describe_workers")
        return {
            w.name: {"pod": w.name, "node": f"node-{i}", "state": "Lost" if w.name in self.gone else "Running"}
            for i, w in enumerate(self.plan.workers)
        }

    def release(self) -> None:
        self._hook("release")


class FakeClusterBackend(FakeBackend, protocols.ReplacesWorkers, protocols.ClusterLauncher):
    """The fake, with lost workers replaced (--retries) and, where ``launcher_in_cluster``, a launcher
    in the cluster renewed for each attempt (``relaunch``)."""

    capabilities = base.Capabilities(detach=True, replace_workers=True, cluster_launcher=True)

    def __init__(self, spec, plan, rundir, *, launcher_in_cluster: bool = False, **kw):
        super().__init__(spec, plan, rundir, **kw)
        self.launcher_in_cluster = launcher_in_cluster

    def replace_workers(self, names: list[str], why: str = "lost") -> dict[str, str]:
        self._hook("replace_workers", list(names))
        for name in names:
            self.gone.pop(name, None)
            self.settle_only.discard(name)
            self.generation[name] += 1
        return {}

    def relaunch(self, attempt: int) -> None:
        self._hook("relaunch", attempt)

    @classmethod
    def remote_mpi_info(cls, spec):
        return None  # the fake workload needs no MPI

    def run_launcher(self, output, deadline):
        raise AssertionError("the fake workload follows no launcher: it plays its outcomes")

    def hand_off(self, deadline: float, progress) -> None:
        self._hook("hand_off", deadline)

    def manage_flags(self) -> str:
        return "--backend fake"
