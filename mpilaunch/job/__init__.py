"""A job on the submitting side (or in a cluster launcher): the lifecycle that runs it, the spares
it swaps in, and the commands that find it again by name and show its record. What it needs
while it runs (output, processes, run directory, record, summary) is ``mpilaunch/runtime/``.

Kept empty: ``mpilaunch.job.lifecycle`` pulls in the backends; ``mpilaunch.runtime.procs`` must not.
"""
