"""The biggest job mpilaunch plans (docs/usage.md, "Sizing").

Per-rank and per-worker work (hostfile, rank map, pods, containers) grows with these, and a typo
such as --np 100000000 must be an error, not an endless plan. A module of their own: the spec
(core/spec.py) and the option parsers it declares (core/rank_filter.py) both read them.
"""

MAX_RANKS = 65536
MAX_WORKERS = 8192
