"""The parameter-server options of a run (``--ps``, ``--workers``, ``-r``, ...), declared once.

``JobSpec.ps`` holds them (core/spec.py); they are also what makes ``--mode`` ps where it
is not given (``implied_mode``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .declared import REFUSED, from_args, option

PS_GROUP = "parameter-server mode"  # their option group in `mpilaunch run --help`


@dataclass(frozen=True)
class PsOptions:
    """A TensorFlow parameter-server job's task counts and files (``--ps`` and friends)."""

    ps: int = option(
        0, flag="--ps", type=int, metavar="N", group=PS_GROUP, detached=REFUSED, help="parameter-server tasks"
    )
    workers: int = option(
        0, flag="--workers", type=int, metavar="N", group=PS_GROUP, detached=REFUSED, help="worker tasks"
    )
    chief: bool = option(
        False,
        flag="--chief",
        group=PS_GROUP,
        detached=REFUSED,
        help="one chief task: the job succeeds when it exits 0 (without one, when every worker does)",
    )
    evaluator: bool = option(
        False, flag="--evaluator", group=PS_GROUP, detached=REFUSED, help="one evaluator task, ended with the job"
    )
    tensorboard: bool = option(
        False,
        flag="--tensorboard",
        group=PS_GROUP,
        detached=REFUSED,
        help="serve TensorBoard over the -o directory while the job runs, and print its URL",
    )
    requirement: str | None = option(
        flag=("-r", "--cluster-requirement"),
        group=PS_GROUP,
        detached=REFUSED,
        help='the tasks in the YARN-DTF form, e.g. "ps:2,worker:4" (instead of --ps/--workers/...)',
    )
    input_path: str | None = option(
        flag=("-i", "--input"),
        metavar="INPUT",
        group=PS_GROUP,
        detached=REFUSED,
        help="the job's input path, given to every task as $DTF_INPUT_PATH",
    )
    output_path: str | None = option(
        flag=("-o", "--output"),
        metavar="OUTPUT",
        group=PS_GROUP,
        detached=REFUSED,
        help="the job's output path, given to every task as $DTF_OUTPUT_PATH (and read by --tensorboard)",
    )
    script: str | None = option(
        flag=("-s", "--script"),
        metavar="SCRIPT",
        group=PS_GROUP,
        detached=REFUSED,
        help="a file shipped to every task's container, its path there in $DTF_TASK_SCRIPT",
    )

    def sizes_tasks(self) -> bool:
        """Whether any option that sizes the tasks is given (not the paths -i/-o/-s): they imply --mode ps."""
        return self.requirement is not None or any(
            (self.ps, self.workers, self.chief, self.evaluator, self.tensorboard)
        )


def implied_mode(value, args) -> str:
    """--mode, else ps where the tasks are sized (-r, --ps, ...), else allreduce."""
    return value or ("ps" if from_args(PsOptions, args).sizes_tasks() else "allreduce")
