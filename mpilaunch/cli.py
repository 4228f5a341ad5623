"""Command-line parsing only: build a JobSpec and hand it to lifecycle.run_spec."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, backends
from .core.artifacts import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILE_BYTES, format_size, parse_size
from .core.errors import MpilaunchError, UsageError
from .core.exit_codes import EXIT_HUNG, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREFLIGHT
from .core.orphan import DEFAULT_ORPHAN_TIMEOUT
from .core.rank_filter import parse_rank_list
from .core.spec import LAUNCHERS, ON_STALL, PREFLIGHT, JobSpec, PsOptions, check_duration, mpi_choices


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message, f"see '{self.prog} --help'")


def default_backend() -> str:
    return os.environ.get("MPILAUNCH_BACKEND", "local")


def build_parser(prog: str = "mpilaunch", backend_names: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The run/render parser, with an option group for each of ``backend_names`` (default: every
    registered backend, installed packages' included)."""
    backend_names = backends.names() if backend_names is None else backend_names
    p = _Parser(
        prog=prog,
        usage=f"{prog} [run] [OPTIONS] -- COMMAND [ARGS...]",
        description="Launch MPI / Horovod and TensorFlow PS jobs on local workers, Kubernetes or YARN without SSH.",
        epilog=f"other commands: {', '.join(name for name in SUBCOMMANDS if name != 'run')} ({prog} COMMAND --help)",
    )
    p.add_argument("--version", action="version", version=f"{prog} {__version__}")
    size = p.add_argument_group("sizing")
    size.add_argument("--gpus", type=int, help="total GPUs = MPI ranks, one rank per GPU")
    size.add_argument("--gpus-per-node", type=int, help="GPUs per worker (default: discovered, else 8)")
    size.add_argument("--np", type=int, help="ranks for CPU-only jobs")
    size.add_argument("--slots-per-worker", type=int, help="spread --np ranks over ceil(N/S) workers")
    size.add_argument(
        "--hostfile", help="local and ssh backends: take worker names and slots (ssh: the hosts) from this hostfile"
    )
    size.add_argument(
        "--bind-gpus",
        action="store_true",
        help="each rank sees only its own GPU (off: Horovod picks local_rank itself)",
    )

    run = p.add_argument_group("backend and MPI")
    run.add_argument(
        "--backend",
        default=default_backend(),
        help=f"one of {', '.join(backend_names)} (default: local or $MPILAUNCH_BACKEND)",
    )
    run.add_argument("--mpi", default="auto", help=f"one of {', '.join(mpi_choices())}")
    run.add_argument("--mpirun", help="path of the mpirun to use")
    run.add_argument(
        "-x",
        dest="env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="export a variable to every rank (repeatable)",
    )
    run.add_argument("--mpi-args", default="", help="extra arguments for mpirun, as one string")
    run.add_argument("--launcher", default="auto", help=f"where mpirun runs: one of {', '.join(LAUNCHERS)}")

    ctl = p.add_argument_group("job control")
    ctl.add_argument("--name", help="job name (default: generated)")
    ctl.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for all workers (default 300)")
    ctl.add_argument("--timeout", type=float, help="wall-clock limit of the run in seconds")
    ctl.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SEC",
        help="declare the job hung when no rank printed anything and every rank's stacks stayed the "
        "same this long: the verdict names the rank(s) holding it up",
    )
    ctl.add_argument(
        "--on-stall",
        choices=ON_STALL,
        default="stop",
        help=f"a hung job: stop it (exit {EXIT_HUNG}, default) or report it and let it run on",
    )
    ctl.add_argument(
        "--preflight",
        choices=PREFLIGHT,
        default="off",
        help="check the job's workers before its program starts (GPUs, scratch space, clock, a "
        "timed compute kernel against the other workers): 'report' names a failing or slow worker, "
        f"'enforce' also stops the job before its program (exit {EXIT_PREFLIGHT}); default off",
    )
    ctl.add_argument(
        "--preflight-margin",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="--preflight names a worker this much slower than the median (default 0.5: 50%%)",
    )
    ctl.add_argument(
        "--straggler-report",
        type=float,
        nargs="?",
        const=30.0,
        metavar="SEC",
        help="sample every rank's stacks every SEC seconds (default 30) while the job runs and name, at "
        "its end, the rank the others most often waited for in MPI, with where it was",
    )
    ctl.add_argument(
        "--orphan-timeout",
        type=float,
        default=DEFAULT_ORPHAN_TIMEOUT,
        metavar="SEC",
        help="k8s/yarn: the cluster ends the job when this mpilaunch has been gone (killed, "
        f"disconnected) for SEC seconds (default {DEFAULT_ORPHAN_TIMEOUT:g})",
    )
    ctl.add_argument(
        "--detach",
        action="store_true",
        help="submit, print the job's name and how to follow it, and exit 0 (cluster backends)",
    )
    ctl.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="after a lost worker, replace it and relaunch mpirun on the same allocation, up to N times",
    )
    ctl.add_argument(
        "--retry-rank-failures", action="store_true", help="with --retries: relaunch after a rank failure too"
    )
    ctl.add_argument("--output-dir", help="write one log per rank and report.json here")
    ctl.add_argument(
        "--output-ranks",
        metavar="LIST",
        help="show only these ranks' lines on the terminal, e.g. 0 or 0-3,8 (every rank still goes to "
        "its --output-dir log; mpilaunch's own lines always show)",
    )
    add_collect_arguments(p)
    ctl.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan, hostfile, mpirun command and environment; create nothing",
    )
    ctl.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the placement check (every rank on its planned worker, np ranks in all)",
    )
    ctl.add_argument("-q", "--quiet", action="store_true", help="no progress lines")

    # each backend's own options (backends/<name>/options.py), in a group of its own
    for name in backend_names:
        backends.options_class(name).add_arguments(BackendGroup(p, p.add_argument_group(f"--backend {name}"), name))

    ps = p.add_argument_group("parameter-server mode")
    ps.add_argument("--mode", help="allreduce (default) or ps (implied by -r and the other options of this group)")
    ps.add_argument("--ps", type=int, default=0)
    ps.add_argument("--workers", type=int, default=0)
    ps.add_argument("--chief", action="store_true")
    ps.add_argument("--evaluator", action="store_true")
    ps.add_argument("--tensorboard", action="store_true")
    ps.add_argument("-r", "--cluster-requirement", dest="requirement", help='YARN-DTF form, e.g. "ps:2,worker:4"')
    ps.add_argument("-i", "--input")
    ps.add_argument("-o", "--output")
    ps.add_argument("-s", "--script")
    return p


def add_collect_arguments(p: argparse.ArgumentParser) -> None:
    """--collect and --timeline: files out of the workers (job/artifacts.py)."""
    group = p.add_argument_group("artifacts")
    group.add_argument(
        "--collect",
        action="append",
        default=[],
        metavar="GLOB",
        help="after the ranks end (also when they failed, timed out or hung), copy the files matching GLOB "
        "(relative to the ranks' working directory, or absolute) from each worker into --output-dir "
        "(else the job's record) under files/WORKER/ (repeatable)",
    )
    group.add_argument(
        "--collect-max",
        type=lambda text: parse_size("--collect-max", text),
        default="1G",  # a string: argparse passes it through type, and --help shows it as typed
        metavar="SIZE",
        help=f"bring back at most SIZE in all, e.g. 1G (default {format_size(DEFAULT_MAX_BYTES)})",
    )
    group.add_argument(
        "--collect-max-file",
        type=lambda text: parse_size("--collect-max-file", text),
        default="512M",
        metavar="SIZE",
        help=f"skip a file bigger than SIZE (default {format_size(DEFAULT_MAX_FILE_BYTES)})",
    )
    group.add_argument(
        "--timeline",
        metavar="FILE",
        help="Horovod's timeline: HOROVOD_TIMELINE=FILE for the ranks (a path in the workers), and the file "
        "brought back as --collect does (horovodrun --timeline-filename)",
    )


class BackendGroup:
    """One backend's option group in a parser that may hold several backends' groups. Two backends
    may take the same option (--queue: a YARN queue, a Kueue LocalQueue), each declaring it with its
    own help; argparse refuses a second declaration of an option string, so the first one stands,
    the second's help is added to it, and both backends read it. The two must parse alike."""

    def __init__(self, parser: argparse.ArgumentParser, group, backend: str):
        self._parser, self._group, self._backend = parser, group, backend

    def add_argument(self, *flags, **kwargs):
        declared = self._parser._option_string_actions.get(flags[0])
        if declared is None:
            return self._group.add_argument(*flags, **kwargs)
        this = argparse.ArgumentParser(add_help=False).add_argument(*flags, **kwargs)
        if _parses_as(this) != _parses_as(declared):
            raise ValueError(f"the {self._backend} backend declares {flags[0]} unlike another backend does")
        if this.help:
            declared.help = f"{declared.help}; --backend {self._backend}: {this.help}"
        return declared

    def __getattr__(self, name):  # anything else a backend asks of its group
        return getattr(self._group, name)


def _parses_as(action: argparse.Action) -> tuple:
    return (
        type(action),
        tuple(action.option_strings),
        action.dest,
        action.default,
        action.type,
        action.nargs,
        action.const,
        action.choices,
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def split_mpi_args(text: str) -> tuple[str, ...]:
    """--mpi-args "...": split like a shell would; an unbalanced quote is bad input, not a traceback."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as e:  # "No closing quotation", "No escaped character"
        raise UsageError(
            f"cannot split --mpi-args {text!r}: {str(e)[:1].lower()}{str(e)[1:]}",
            "quote --mpi-args as one shell word and balance the quotes inside it, "
            "e.g. --mpi-args '--mca btl \"tcp,self\"'",
        ) from None


def spec_from_args(args, command: list[str]) -> JobSpec:
    return JobSpec(
        command=tuple(command),
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        np=args.np,
        slots_per_worker=args.slots_per_worker,
        backend=args.backend,
        mpi=args.mpi,
        mpirun=args.mpirun,
        env=tuple(args.env),
        mpi_args=split_mpi_args(args.mpi_args),
        launcher=args.launcher,
        name=args.name,
        start_timeout=args.start_timeout,
        timeout=args.timeout,
        stall_timeout=args.stall_timeout,
        on_stall=args.on_stall,
        preflight=args.preflight,
        preflight_margin=args.preflight_margin,
        straggler_report=args.straggler_report,
        orphan_timeout=args.orphan_timeout,
        output_dir=args.output_dir,
        output_ranks=None if args.output_ranks is None else parse_rank_list(args.output_ranks),
        collect=tuple(args.collect),
        collect_max_bytes=args.collect_max,
        collect_max_file_bytes=args.collect_max_file,
        timeline=args.timeline,
        dry_run=args.dry_run,
        bind_gpus=args.bind_gpus,
        hostfile=args.hostfile,
        verify=args.verify,
        retries=args.retries,
        detach=args.detach,
        retry_rank_failures=args.retry_rank_failures,
        mode=args.mode
        or (
            "ps"
            if (
                args.requirement is not None
                or args.ps
                or args.workers
                or args.chief
                or args.evaluator
                or args.tensorboard
            )
            else "allreduce"
        ),
        backend_options=backends.options_class(args.backend).from_args(args),
        ps=PsOptions(
            ps=args.ps,
            workers=args.workers,
            chief=args.chief,
            evaluator=args.evaluator,
            tensorboard=args.tensorboard,
            input_path=args.input,
            output_path=args.output,
            script=args.script,
            requirement=args.requirement,
        ),
    )


# Options whose value is often itself an option: `--mpi-args "--mca btl tcp,self"`.
# argparse takes a value that starts with "-" for the next option and fails
# ("expected one argument"); these always take exactly one value, so the next
# word is glued to them (`--mpi-args=...`), which argparse reads as the value.
VALUE_MAY_START_WITH_DASH = ("--mpi-args",)


def glue_dash_values(options: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(options):
        if options[i] in VALUE_MAY_START_WITH_DASH and i + 1 < len(options) and options[i + 1].startswith("-"):
            out.append(f"{options[i]}={options[i + 1]}")
            i += 2
        else:
            out.append(options[i])
            i += 1
    return out


def chosen_backend(options: list[str]) -> str | None:
    """--backend's value among the options (its default where absent); None for --help."""
    if "-h" in options or "--help" in options:
        return None
    first = _Parser(add_help=False)
    first.add_argument("--backend", default=default_backend())
    return first.parse_known_args(options)[0].backend


def parse_run(argv: list[str], prog: str = "mpilaunch") -> tuple[JobSpec, argparse.Namespace]:
    """A run's spec. The parser first holds the chosen backend's options alone: each backend's
    options class costs its import (~0.5-2 ms), paid by every launch. Anything it does not know
    (another backend's option, a typo) is parsed again by the whole parser, so what is accepted,
    and every error, is as with every backend's options (--help: all of them, installed ones too)."""
    options, command = split_command(argv)
    options = glue_dash_values(options)
    chosen = chosen_backend(options)
    if chosen is not None:
        args, unknown = build_parser(backend_names=(chosen,)).parse_known_args(options)
        if not unknown:
            check_default_backend(args, options)
            return spec_from_args(args, command), args
    names = None if chosen is None else tuple(backends.BUILTIN) + (() if chosen in backends.BUILTIN else (chosen,))
    args, unknown = build_parser(backend_names=names).parse_known_args(options)
    if unknown:
        raise unrecognized(unknown, argv, prog)
    check_default_backend(args, options)
    return spec_from_args(args, command), args


def check_default_backend(args: argparse.Namespace, options: list[str]) -> None:
    """--hostfile on the local backend nobody chose: refused. A hostfile names hosts, and whoever
    gives one without --backend means to run there (as mpirun --hostfile does); the local backend
    would instead run every "host" as a worker process on this machine, all 128 ranks of a
    cluster's hostfile on one laptop, without a word. Naming --backend local (or setting
    $MPILAUNCH_BACKEND) keeps local workers named and sized after a hostfile."""
    if not args.hostfile or args.backend != "local" or os.environ.get("MPILAUNCH_BACKEND"):
        return
    given = _Parser(add_help=False)
    given.add_argument("--backend")
    if given.parse_known_args(options)[0].backend is None:
        raise UsageError(
            f"--hostfile {args.hostfile} names hosts, but the default backend (local) runs every worker "
            "on this machine",
            "to run on those hosts add --backend ssh; for local workers named and sized after the "
            "hostfile, add --backend local",
        )


def unrecognized(unknown: list[str], argv: list[str], prog: str = "mpilaunch") -> UsageError:
    """Words the parser does not know. Without '--', a word that is no option is most likely the
    start of the program (``mpilaunch --np 4 python train.py``): the hint shows the command line with
    '--' put in before it."""
    import shlex  # an error path: not paid by every launch

    message = f"unrecognized arguments: {' '.join(unknown)}"
    if "--" in argv or unknown[0].startswith("-"):
        return UsageError(
            message,
            f"see '{prog} --help'"
            + ("" if "--" in argv else f"; the program goes after '--', e.g. {prog} --np 4 -- python train.py"),
        )
    # where the program starts: the last place from which every unknown word follows in order
    # (in --name python --np 4 python train.py, the first "python" is the option's value)
    start = max(i for i, word in enumerate(argv) if word == unknown[0] and _in_order(unknown, argv[i:]))
    options, program = argv[:start], argv[start:]
    return UsageError(
        message,
        f"put the program after '--', which ends mpilaunch's options: {prog} {shlex.join(options + ['--'] + program)}",
    )


def _in_order(words: list[str], seq: list[str]) -> bool:
    it = iter(seq)
    return all(any(w == s for s in it) for w in words)


def _job_parser(command: str, argv: list[str], **kwargs):
    """The parser of a command on a job found by name, and its backend's options class: the backend's
    options that find the job (add_manage_arguments: --namespace, ...) come with --backend."""
    first = _Parser(prog=f"mpilaunch {command}", add_help=False)
    first.add_argument("--backend", default=default_backend())
    options = backends.options_class(first.parse_known_args(argv)[0].backend)
    p = _Parser(prog=f"mpilaunch {command}", **kwargs)
    p.add_argument("name", help="the job's --name")
    p.add_argument("--backend", default=default_backend())
    options.add_manage_arguments(p)
    return p, options


def parse_job_action(action: str, argv: list[str]) -> argparse.Namespace:
    p, options = _job_parser(action, argv)
    if action == "logs":
        p.add_argument("-f", "--follow", action="store_true", help="keep printing while the launcher runs")
    if action == "wait":
        p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    args = p.parse_args(argv)
    options.check_manage_arguments(args)
    if action == "wait":
        check_duration(
            "--timeout",
            args.timeout,
            "give the seconds to wait for the job, e.g. --timeout 600, or leave it out to wait until it ends",
        )
    return args


def parse_stacks(argv: list[str]) -> argparse.Namespace:
    from .hang.collect import DEFAULT_DEADLINE_S

    p, options = _job_parser(
        "stacks",
        argv,
        description="Show where every rank of a running job is: its stacks, grouped by identity, and "
        "one 'mpilaunch: hang:' line naming the rank(s) that stand out.",
    )
    p.add_argument("--json", action="store_true", help="print the groups, the verdict and every rank's frames as JSON")
    p.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        metavar="SEC",
        help=f"give up on workers that have not answered after this long (default {DEFAULT_DEADLINE_S:g})",
    )
    args = p.parse_args(argv)
    options.check_manage_arguments(args)
    check_duration("--deadline", args.deadline, "give the seconds to wait for the workers, e.g. --deadline 15")
    return args


def cmd_rbac(argv: list[str]) -> int:
    """``mpilaunch rbac --namespace NS``: the objects an admin applies once (backends/k8s/rbac.py)."""
    from .backends.k8s import rbac
    from .backends.k8s.options import NAME_RE, check_namespace

    p = _Parser(
        prog="mpilaunch rbac",
        description="Print the ServiceAccount, Role and RoleBinding an admin of a namespace applies once "
        "(| kubectl apply -f -), so that users holding only the 'edit' role run jobs there "
        "with --service-account NAME. Nothing cluster-wide.",
    )
    p.add_argument("--namespace", required=True, help="the namespace the jobs run in")
    p.add_argument(
        "--service-account",
        default=rbac.DEFAULT_ACCOUNT,
        metavar="NAME",
        help=f"the ServiceAccount's (and its Role's) name (default {rbac.DEFAULT_ACCOUNT})",
    )
    args = p.parse_args(argv)
    check_namespace(args.namespace)
    if not NAME_RE.fullmatch(args.service_account):
        raise UsageError(
            f"invalid --service-account {args.service_account!r}",
            "lowercase letters, digits, '-' and '.', e.g. --service-account mpilaunch",
        )
    sys.stdout.write(rbac.render(args.namespace, args.service_account))
    return 0


def cmd_run(argv: list[str]) -> int:
    from .job.lifecycle import run_spec

    spec, args = parse_run(argv)
    result = run_spec(spec, quiet=args.quiet)
    if result.exit_code != 0 and result.failure:
        print(f"mpilaunch: error: {result.failure}", file=sys.stderr)
    return result.exit_code


def cmd_report(argv: list[str]) -> int:
    """``mpilaunch report [NAME|PATH [NAME|PATH]]``: the records every job keeps (job/record.py)."""
    from .job import manage, record

    p = _Parser(
        prog="mpilaunch report",
        description="Print a job's closing summary again from its record: the newest record of all, "
        "the newest of the job NAME, or the report.json PATH (or a directory holding one). "
        "Two give both side by side; the same NAME twice, its last two runs. Records are kept in "
        f"$XDG_STATE_HOME/mpilaunch/runs (${record.STATE_DIR_ENV} replaces $XDG_STATE_HOME/mpilaunch), "
        f"the newest ${record.KEEP_ENV} (default {record.DEFAULT_KEEP}).",
    )
    p.add_argument("records", nargs="*", metavar="NAME|PATH", help="a job's --name, or a report.json")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="write the record's timeline to FILE: one self-contained page (launch phases per worker, "
        "each rank's run, attempts and hangs on one time axis) to open in a browser",
    )
    args = p.parse_args(argv)
    if len(args.records) > 2:
        raise UsageError(
            f"mpilaunch report takes at most two records, got {len(args.records)}",
            "give one record to summarize, or two to see side by side",
        )
    if args.html and len(args.records) > 1:
        raise UsageError("--html draws one record's timeline, not two", "give one NAME or PATH with --html")
    return manage.report(args.records, os.environ, sys.stdout, html=args.html)


def cmd_agent(argv: list[str]) -> int:
    from .agent import main as agent_main

    return agent_main(argv) or EXIT_OK


def cmd_render(argv: list[str]) -> int:
    from .job import manage

    return manage.render(parse_run(argv, "mpilaunch render")[0])


def cmd_stacks(argv: list[str]) -> int:
    from .job import manage

    return manage.stacks(parse_stacks(argv))


def cmd_job_action(action: str):
    """``mpilaunch status|logs|delete|wait NAME``: a job found again by its name."""

    def command(argv: list[str]) -> int:
        from .job import manage

        return manage.job_action(action, parse_job_action(action, argv))

    return command


# Every subcommand, the one list dispatch and --help read; without one, the arguments are run's.
SUBCOMMANDS = {
    "run": cmd_run,
    "render": cmd_render,
    **{action: cmd_job_action(action) for action in ("status", "logs", "delete", "wait")},
    "stacks": cmd_stacks,
    "report": cmd_report,
    "rbac": cmd_rbac,
    "agent": cmd_agent,
}


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    return cmd_run(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = dispatch(argv)
    except MpilaunchError as e:
        print(e.format(), file=sys.stderr)
        code = e.exit_code
    except KeyboardInterrupt:
        print("mpilaunch: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> None:
    """Leave now that the command is done, skipping the interpreter's teardown.

    Freeing every module and object at exit cost 15-24 ms after each local
    launch here, paid after the job's result is known. By this point every
    worker, pod and container is released by the command itself (never by a
    finalizer). What would still run at exit does run: atexit handlers
    (weakref finalizers among them) and the flush of stdout and stderr.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): nothing more can be shown
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
