"""The environment check: each rank runs the program and the MPI library the launch planned.

Next to the placement check (``placement.py``): every rank wrapper reports
the program its PATH resolved, a digest of the variables mpilaunch
forwarded (start line) and, once the program has loaded one, the MPI
library it loaded (``rank.py``). A rank that runs another interpreter than
the one the launcher resolved (a venv's python shadowed by the system one)
or links another MPI than the mpirun that started it (an mpi4py built
against MPICH under Open MPI runs as N singletons) fails the job, exit 4,
with the rank, its worker and the difference named. Users find both by hand
today, after a wrong result or a hang.

Pure functions; ``workloads/verification.py`` feeds them.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from . import mpi, rank_env
from .placement import Mismatch

PROGRAM = "program"
MPI_LIBRARY = "mpi-library"
KINDS = (PROGRAM, MPI_LIBRARY)

_OPENMPI_SONAME = re.compile(r"^libmpi\.so\.40\.(\d+)")
_MPICH_ABI_SONAME = re.compile(r"^lib(?:mpi|mpich)\.so\.12\b")


@dataclass(frozen=True)
class Expected:
    """What the launch planned: the program (None when the workers' PATH is not known where
    mpirun runs: then all ranks must agree), and the MPI of the mpirun that starts them."""

    command: str  # the first word of the user's command, as given
    program: str | None
    flavour: str  # openmpi | mpich | intel
    major: int
    mpirun: str
    version: str
    env_digest: str | None = None
    # the forwarded variables' values as sent (never shown as they are: rank_env.shown_value)
    forwarded: dict = field(default_factory=dict, repr=False)
    # what the MPI's launcher puts ahead on the ranks' path lists (MpiFlavour.prepended_dirs)
    prepended_dirs: tuple[str, ...] = ()


def library_mpi(path: str) -> tuple[str, int | None] | None:
    """(family, Open MPI major) of an MPI library from its file name; None if not recognised.

    Open MPI's libtool versions: 4.0 is libmpi.so.40.20, 4.1 40.30, 5.0
    40.40. MPICH, Intel MPI and the other MPICH derivatives share the
    MPICH ABI (libmpi.so.12 / libmpich.so.12) and run under one another's
    hydra.
    """
    base = os.path.basename(path)
    m = _OPENMPI_SONAME.match(base)
    if m:
        return "openmpi", (5 if int(m.group(1)) >= 40 else 4)
    if _MPICH_ABI_SONAME.match(base):
        return "mpich-abi", None
    return None


def _mpirun_family(flavour: str) -> str:
    strategy = mpi.FLAVOURS.get(flavour)
    return strategy.abi if strategy is not None else "mpich-abi"


def _describe_library(family: str, major: int | None) -> str:
    return {"openmpi": f"Open MPI {major}" if major else "Open MPI", "mpich-abi": "MPICH (or Intel MPI)"}[family]


def _describe_mpirun(e: Expected) -> str:
    strategy = mpi.FLAVOURS.get(e.flavour)
    name = strategy.title if strategy is not None else e.flavour
    return f"{name} {e.version} ({e.mpirun})"


def _ranks(ranks: list[int]) -> str:
    from .placement import ranges

    return ("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks)


def _where(ranks: list[int], workers: dict[int, str]) -> str:
    names = sorted({workers.get(r, "?") for r in ranks})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{_ranks(ranks)} on worker{'s' if len(names) > 1 else ''} {shown}"


def check_programs(e: Expected, programs: dict[int, str | None], workers: dict[int, str]) -> Mismatch | None:
    """Ranks whose PATH resolved another program than the plan's (or than most ranks, when the
    plan's is unknown). A rank that found no program fails by itself (exit 127)."""
    found = {r: p for r, p in programs.items() if p}
    if not found:
        return None
    if e.program is not None:
        expected, basis = e.program, "mpilaunch resolved it to"
    else:
        expected = Counter(found.values()).most_common(1)[0][0]
        basis = "the other ranks run"
    odd = sorted(r for r, p in found.items() if p != expected)
    if not odd:
        return None
    theirs = sorted({found[r] for r in odd})
    return Mismatch(
        PROGRAM,
        f"environment check failed: {_where(odd, workers)} "
        f"{'run' if len(odd) > 1 else 'runs'} {', '.join(theirs)} for {e.command!r}; "
        f"{basis} {expected}",
    )


def check_libraries(e: Expected, libraries: dict[int, str], workers: dict[int, str]) -> Mismatch | None:
    """Ranks whose program loaded another MPI than the one of the mpirun that started them."""
    family = _mpirun_family(e.flavour)
    odd = {}
    for r, path in libraries.items():
        seen = library_mpi(path)
        if seen is None:
            continue
        if seen[0] != family or (family == "openmpi" and e.major in (4, 5) and seen[1] != e.major):
            odd[r] = (path, seen)
    if not odd:
        return None
    ranks = sorted(odd)
    path, (lib_family, lib_major) = odd[ranks[0]]
    return Mismatch(
        MPI_LIBRARY,
        f"environment check failed: {_where(ranks, workers)} loaded "
        f"{_describe_library(lib_family, lib_major)}'s library {path}, but mpirun is "
        f"{_describe_mpirun(e)}",
    )


def check(e: Expected, environments: dict[int, dict], workers: dict[int, str]) -> Mismatch | None:
    """The first way the ranks' environments differ from the plan, or None."""
    programs = {r: env.get("program") for r, env in environments.items()}
    libraries = {r: env["mpi_library"] for r, env in environments.items() if env.get("mpi_library")}
    return check_libraries(e, libraries, workers) or check_programs(e, programs, workers)


def hint(mismatch: Mismatch, e: Expected) -> str:
    if mismatch.kind == MPI_LIBRARY:
        return (
            "the program (or its mpi4py) was built against another MPI than this mpirun: rebuild it against "
            "this MPI, or pass --mpirun with the MPI it was built with; --no-verify skips this check"
        )
    return (
        f"the workers' PATH finds another {e.command} first: give its full path, or set the ranks' PATH "
        f"with -x PATH=...; --no-verify skips this check"
    )


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))


def rewritten_by_launcher(name: str, sent: str, seen: str | None, prepended: tuple[str, ...]) -> bool:
    """Whether ``seen`` is the path list ``sent`` as the MPI's launcher predictably rewrites it:
    some of its own directories (``prepended``) put ahead, an entry repeated. Open MPI puts
    <prefix>/lib ahead of every rank's LD_LIBRARY_PATH, even one that holds it already; that is
    the MPI's doing on every worker alike, not a worker's startup file."""
    if seen is None or not rank_env.is_path_list(name):
        return False
    entries = seen.split(":") if seen else []
    wanted = _unique(sent.split(":") if sent else [])
    ahead = 0
    while _unique(entries[ahead:]) != wanted:
        if ahead == len(entries) or entries[ahead] not in prepended:
            return False
        ahead += 1
    return True


def _changed(e: Expected, env: dict) -> dict | None:
    """The variables this rank named as seen otherwise than sent, less the launcher's rewrites;
    None when its wrapper named none (an older one, or its line was lost)."""
    seen = env.get("env_seen")
    if seen is None:
        return None
    return {
        name: value
        for name, value in seen.items()
        if not rewritten_by_launcher(name, e.forwarded.get(name, ""), value, e.prepended_dirs)
    }


def digest_mismatches(e: Expected, environments: dict[int, dict]) -> list[int]:
    """Ranks whose forwarded variables differ from what mpilaunch sent (reported, not fatal:
    a worker's own startup files can set them again). A rank that differs only by the MPI
    launcher's predictable rewrites (``rewritten_by_launcher``) does not count."""
    if e.env_digest is None:
        return []
    return sorted(
        r
        for r, env in environments.items()
        if env.get("env_digest") not in (None, e.env_digest) and _changed(e, env) != {}
    )


def env_differences(e: Expected, environments: dict[int, dict]) -> list[dict]:
    """Each forwarded variable some ranks saw otherwise than sent, with both values as
    ``rank_env.shown_value`` shows them (a secret masked, None: unset) and those ranks."""
    groups: dict[tuple, list[int]] = {}
    for r in digest_mismatches(e, environments):
        for name, value in sorted((_changed(e, environments[r]) or {}).items()):
            sent = e.forwarded.get(name)
            shown = None if sent is None else rank_env.shown_value(name, sent)
            groups.setdefault((name, shown, value), []).append(r)
    return [
        {"variable": name, "sent": sent, "seen": seen, "ranks": ranks}
        for (name, sent, seen), ranks in sorted(groups.items(), key=lambda g: (g[0][0], g[1]))
    ]


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def differences_warning(differs: list[int], differences: list[dict], most: int = 8) -> str:
    """The warning for ranks that saw other values than sent, one line per variable and value."""
    from .placement import ranges

    lines = [
        f"mpilaunch: warning: {len(differs)} rank(s) ({ranges(differs)}) saw other values of the forwarded "
        f"variables than mpilaunch sent (a worker's startup files may set them; report.json's environment "
        f"has them)" + (":" if differences else "")
    ]
    for d in differences[:most]:
        lines.append(
            f"  {d['variable']}: {_ranks(d['ranks'])} saw {_shown(d['seen'])}; mpilaunch sent {_shown(d['sent'])}"
        )
    if len(differences) > most:
        lines.append(f"  and {len(differences) - most} more")
    named = {r for d in differences for r in d["ranks"]}
    unnamed = [r for r in differs if r not in named]
    if unnamed:
        lines.append(f"  {_ranks(unnamed)}: which variables differ was not reported")
    return "\n".join(lines)


def summary(e: Expected, environments: dict[int, dict], mismatch: Mismatch | None, enabled: bool) -> dict:
    """report.json's ``environment``: what each rank ran, and whether it matched the plan."""
    return {
        "verified": (mismatch is None) if enabled else None,
        "mismatch": None if mismatch is None else {"kind": mismatch.kind, "message": mismatch.message},
        "expected": {
            "command": e.command,
            "program": e.program,
            "mpi": _describe_mpirun(e),
            "env_digest": e.env_digest,
        },
        "ranks": [
            {
                "rank": r,
                "program": env.get("program"),
                "mpi_library": env.get("mpi_library"),
                "env_digest": env.get("env_digest"),
            }
            for r, env in sorted(environments.items())
        ],
        "env_digest_differs": digest_mismatches(e, environments),
        "env_differs": env_differences(e, environments),
    }
