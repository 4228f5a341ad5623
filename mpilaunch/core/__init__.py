"""The pure core: sizing, hostfiles, the job spec, ClusterSpec, placement and environment checks,
errors and exit codes, the rules of orphaned jobs. Standard library only, no I/O layer's work:
the rank wrapper and the shim import from here, and every layer above does.

Kept empty: importing one module must not import the rest (the hot paths pay per start).
"""
