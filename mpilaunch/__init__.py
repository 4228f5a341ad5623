"""mpilaunch: MPI / Horovod and TensorFlow PS jobs on clusters without SSH.

Kept import-light on purpose: ``mpilaunch-rsh`` and the per-rank wrapper
start once per worker / rank and must not pay for the orchestration code.
"""

from .core.version import __version__  # noqa: F401


def run(command, **options):
    """Run a job and return a :class:`mpilaunch.core.result.JobResult`.

    ``command`` is a list of strings; ``options`` are JobSpec fields, e.g.
    ``mpilaunch.run(["python", "train.py"], np=4, slots_per_worker=2)``.
    """
    from .core.spec import JobSpec
    from .job.lifecycle import run_spec

    return run_spec(JobSpec(command=tuple(command), **options))
