"""Command-line parsing only: build a JobSpec and hand it to lifecycle.run_spec."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, backends
from .core import declared, env_names
from .core.errors import MpilaunchError, UsageError
from .core.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from .core.spec import (
    ARTIFACTS,
    BACKEND_AND_MPI,
    JOB_CONTROL,
    PS_GROUP,
    SIZING,
    JobSpec,
    check_duration,
    default_backend,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message, f"see '{self.prog} --help'")


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
    # every option is declared once, on its field (core/spec.py; backends/<name>/options.py)
    groups = {title: p.add_argument_group(title) for title in (SIZING, BACKEND_AND_MPI, JOB_CONTROL, ARTIFACTS)}
    backend_groups = {name: BackendGroup(p, p.add_argument_group(f"--backend {name}"), name) for name in backend_names}
    groups[PS_GROUP] = p.add_argument_group(PS_GROUP)
    declared.add_arguments(JobSpec, groups, context={"backends": backend_names})
    groups[JOB_CONTROL].add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    for name, group in backend_groups.items():
        backends.options_class(name).add_arguments(group)
    return p


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


def spec_from_args(args, command: list[str]) -> JobSpec:
    """The spec from the parsed arguments: each field from the option of its name (core/declared.py)."""
    options = backends.options_class(args.backend).from_args(args)
    return declared.from_args(JobSpec, args, command=tuple(command), backend_options=options)


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
    if not args.hostfile or args.backend != "local" or os.environ.get(env_names.BACKEND):
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
    """``mpilaunch report [NAME|PATH [NAME|PATH]]``: the records every job keeps (runtime/record.py)."""
    from .job import manage
    from .runtime import record

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
