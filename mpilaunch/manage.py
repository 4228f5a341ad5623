"""`mpilaunch render|status|logs|delete`: look at or remove jobs on cluster backends."""

from __future__ import annotations

import os
import sys

from . import backends
from .errors import UsageError


def cmd_render(argv: list[str]) -> int:
    """Write what a run would create, without creating it (a dry run)."""
    from .cli import parse_run
    from .job import run_spec

    spec, args = parse_run(argv)
    from dataclasses import replace

    import io

    buf = io.StringIO()
    run_spec(replace(spec, dry_run=True), stdout=buf, quiet=True)
    head, sep, manifests = buf.getvalue().partition("\nmanifests:\n")
    if sep:  # a cluster backend: applicable YAML, the plan as comments above it
        head = "".join(line + "\n" if line.startswith("#") else f"# {line}\n" for line in head.splitlines())
    sys.stdout.write(head + manifests if sep else head)
    return 0


def cmd_job(action: str, argv: list[str]) -> int:
    from .cli import _Parser

    p = _Parser(prog=f"mpilaunch {action}")
    p.add_argument("name")
    p.add_argument("--backend", default=os.environ.get("MPILAUNCH_BACKEND", "local"))
    p.add_argument("--namespace")
    p.add_argument("--context")
    p.add_argument("--kubeconfig")
    args = p.parse_args(argv)
    backend_cls = backends.load(args.backend)
    handler = getattr(backend_cls, f"manage_{action}", None)
    if handler is None:
        raise UsageError(
            f"'{action}' applies to jobs on cluster backends, not --backend {args.backend}",
            "local jobs live and die with their mpilaunch process; use --backend k8s or yarn",
        )
    return handler(args, sys.stdout) or 0


def main(action: str, argv: list[str]) -> int:
    if action == "render":
        return cmd_render(argv)
    return cmd_job(action, argv)
