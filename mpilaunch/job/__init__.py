"""A job on the submitting side (or in a cluster launcher): the lifecycle that runs it, the
commands that find it again by name, its output, processes, run directory and progress, and the
tools copied into images that lack mpilaunch.

Kept empty: ``mpilaunch.job.lifecycle`` pulls in the backends; ``mpilaunch.job.procs`` must not.
"""
