"""Where a hung job's ranks are: every rank's stacks, grouped, and the odd one out (issue 42).

- ``verdict``: pure; rank stacks in, groups and the one ``mpilaunch: hang:`` line out.
- ``probe``: the stdlib script that runs in each worker (through its exec agent) and
  reports that worker's rank processes: state, Python and native frames.
- ``collect``: runs the probe on every worker at once, bounded by a deadline.
- ``site/sitecustomize.py``: the no-tool fallback, a faulthandler a rank's Python arms
  at start, that the probe triggers where py-spy is missing or refused.

The modules are imported where a job uses them (a stall, a timeout, a straggler report), not
by every launch: ``verdict``'s patterns and dataclasses alone are ~5 ms of a launch's start.
"""

#: the bound on a whole collection (issue 42: at most 15 s at 64 ranks)
DEFAULT_DEADLINE_S = 15.0
