"""Exec channels for mpilaunch-rsh.

Each module here exposes ``run(context: dict, worker: dict, command: str) -> int``:
run ``command`` through ``/bin/sh -c`` inside ``worker``, stream this
process's stdin/stdout/stderr, return the remote exit status.  The shim
imports the one named by the context's ``transport`` lazily, so keep these
modules (and this package) free of heavy imports at module level.
"""
