"""Where a hung job's ranks are: every rank's stacks, grouped, and the odd one out (issue 42).

- ``verdict``: pure; rank stacks in, groups and the one ``mpilaunch: hang:`` line out.
- ``probe``: the stdlib script that runs in each worker (through its exec agent) and
  reports that worker's rank processes: state, Python and native frames.
- ``collect``: runs the probe on every worker at once, bounded by a deadline.
- ``site/sitecustomize.py``: the no-tool fallback, a faulthandler a rank's Python arms
  at start, that the probe triggers where py-spy is missing or refused.
"""
