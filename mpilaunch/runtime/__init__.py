"""What a job needs on this machine while it runs, whichever side runs it (the submitting
mpilaunch, a launcher in a pod or container, the workloads, the backends): its output and
progress, its processes, its run directory, the record and closing summary it leaves, the files
collected from its workers, the signals that interrupt it, and the tools copied into images
that lack mpilaunch.

One layer below the backends (pyproject.toml, contract "layers"); ``mpilaunch/job/`` above the
workloads holds what runs a job (the lifecycle) and finds it again by name (manage).
"""
