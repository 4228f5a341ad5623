"""--spares: workers allocated beyond the plan, waiting outside it (local: outside the hostfile; ssh:
the hostfile's next hosts), and the slot each serves.

A *slot* is a worker of the plan: its name is in the hostfile, the rank lines
and the record, and mpirun asks the shim for it. A *member* is what the
backend allocated (an agent, a host). At first each slot is served by the
member of its own name. A spare that takes a slot over keeps its own name as
a member (its process, its host name: MPI tells daemons apart by it), and the
slot's context entry names it (``SPARE_KEY``): the shim then gives the ranks
the slot's name as their worker (``rsh_agent/shim.py``), so what the user
reads is the plan's worker, served by the spare.

Pure bookkeeping; the backends start and stop the members.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..core.spec import Plan, WorkerPlan

#: a slot's context entry names the spare that serves it
SPARE_KEY = "spare"


def served(workers: dict[str, dict], serving: dict[str, str]) -> dict[str, dict]:
    """The context's ``workers`` entries (by the plan's names), each a spare serves naming it."""
    return {name: {**entry, SPARE_KEY: serving[name]} if name in serving else entry for name, entry in workers.items()}


def spare_template(plan: Plan) -> tuple[int, int]:
    """(slots, GPUs) of a spare: enough to take any worker's place."""
    return max(w.slots for w in plan.workers), max(w.gpus for w in plan.workers)


@dataclass
class SparePool:
    """The spares of one job: those waiting (in the order they were asked for) and the swaps made."""

    job_name: str
    slots: int
    gpus: int
    waiting: list[str] = field(default_factory=list)
    serving: dict[str, str] = field(default_factory=dict)  # slot -> the spare that serves it now
    swaps: list[dict] = field(default_factory=list)  # the record's: worker, spare, why
    asked: int = 0
    # the names to hand out, in order, where the backend cannot make one up (ssh: a spare is a real
    # host, the hostfile's next); None: ``<job>-spare-<i>``
    names: list[str] | None = None

    @classmethod
    def for_plan(cls, plan: Plan, names: list[str] | None = None) -> SparePool:
        slots, gpus = spare_template(plan)
        return cls(plan.job_name, slots, gpus, names=None if names is None else list(names))

    def new_spare(self) -> WorkerPlan | None:
        """The next spare to allocate, never a name used before in this job: the next of ``names``
        (None once they ran out), else ``<job>-spare-<i>``."""
        if self.names is None:
            name = f"{self.job_name}-spare-{self.asked}"
        elif self.names:
            name = self.names.pop(0)
        else:
            return None
        self.asked += 1
        return WorkerPlan(name, self.slots, self.gpus)

    def ready(self, name: str) -> None:
        """Spare ``name`` is allocated and waits for a slot."""
        if name not in self.waiting:
            self.waiting.append(name)

    def lost(self, name: str) -> None:
        """A waiting spare died before it served (it is no spare any more)."""
        if name in self.waiting:
            self.waiting.remove(name)

    def take(self, slot: str, why: str) -> str | None:
        """The spare that serves ``slot`` from now on (the oldest waiting), None when none waits."""
        if not self.waiting:
            return None
        spare = self.waiting.pop(0)
        self.serving[slot] = spare
        self.swaps.append({"worker": slot, "spare": spare, "why": why})
        return spare

    def member_of(self, slot: str) -> str:
        """Which member serves ``slot``: a spare's name, else the slot's own."""
        return self.serving.get(slot, slot)

    def to_dict(self) -> dict:
        """report.json's ``spares``."""
        return {"asked": self.asked, "waiting": list(self.waiting), "swaps": list(self.swaps)}


class LauncherSwaps:
    """The swaps a launcher in the cluster made itself (k8s: the launcher pod; YARN: the launcher
    container), read from its lines signed with the job's token (``launcher_lines.swap_line``),
    kept until the lifecycle asks (``ClusterLauncher.relaunched_in_launcher``)."""

    def __init__(self):
        self.relaunches: list[dict] = []
        self.count = 0  # how many were read in all: the fail-fast clock starts again at each

    def take(self, text: str, token: str | None, output, keep) -> None:
        """One swap line: ``keep(swaps)`` does the backend's part (the replaced member released, a
        new spare asked for) and returns the swaps it kept; where one ended an attempt (a lost
        worker), the output hands back that attempt's rank lines and counts the relaunch's alone."""
        from ..core import launcher_lines

        said = launcher_lines.parse_swap(text.rstrip("\n"), token)
        if said is None:
            return  # not signed with this job's token: nothing is moved on its word
        said["swaps"] = keep(said["swaps"])
        ended = any(entry["why"] == "lost" for entry in said["swaps"])
        ranks = output.next_attempt() if ended else None
        self.relaunches.append({**said, "at": time.monotonic(), "ended": ended, "ranks": ranks})
        self.count += 1

    def drain(self) -> list[dict]:
        taken, self.relaunches = self.relaunches, []
        return taken
