"""Every file, module and `:mod:` reference in the docs and in the code's comments exists.

Read: docs/, README.md, ARCHITECTURE.md and BENCHMARKS.md whole, and the comments
and docstrings of mpilaunch/, testbeds/, scripts/, tests/ and benchmarks/. A
reference is
- a module path, `mpilaunch.backends.k8s.in_cluster.reaper` (or `testbeds.k8s.cluster`),
  optionally ending in one name the module defines (`mpilaunch.core.spec.JobSpec`);
- a Sphinx `:mod:` role, relative ones (`:mod:`.manifests``) resolved against
  the package of the module they are written in;
- a file or folder path: `backends/k8s/launch.py`, `testbeds/ssh/`, or a bare
  file name, `test_gang.py`. A path may be written from the repository's root,
  from the folder of the file that names it, or from mpilaunch/, backends/,
  tests/, tests/e2e/ or testbeds/ (the docs say `backends/base.py`); a bare file
  name must name a file somewhere in the repository.
- in docs/, README.md and ARCHITECTURE.md, a module named in prose as the
  docs write them, quoted as code and dotted from anywhere in its package path:
  `job.lifecycle.run_job`, `lifecycle.run_job`, `mpi.WORKER_PATH_ENV` (a package's name) resolve
  to mpilaunch/job/lifecycle.py and what it defines, or to what a package's __init__ holds.
A file moved or renamed without its mentions fails here, naming each stale one.
Paths that are not this repository's (a container's `bin/python`, Horovod's
sources) are listed in NOT_OURS with where they live.
"""

from __future__ import annotations

import ast
import io
import os
import re
import sys
import tokenize
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs"]
CODE = ["mpilaunch", "testbeds", "scripts", "tests", "benchmarks"]
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache"}
# build outputs at the root (.gitignore): the docs site, venvs, wheels
ROOT_OUTPUTS = {"site", ".venv", "build", "dist", "out", ".device-wheels"}
CHECKED_SUFFIXES = (".py", ".sh", ".md", ".toml", ".j2", ".yaml", ".yml", ".json", ".cfg", ".txt")

# Paths that are real but not in this repository: what a container, an
# installed package or another project holds.
NOT_OURS = {
    "launch_container.sh",  # YARN's own per-container script
    "run.py",
    "mpilaunch-tools/",
    "mpilaunch-env/",  # what a YARN container unpacks (backends/yarn/tools.py)
    "venv/",
    "wheel/",  # a cached Horovod build's folders (scripts/build-horovod.sh)
    "setup.py",  # Horovod's sdist
    "horovod/runner/launch.py",  # Horovod's sources: horovodrun's flags (docs/migrating.md)
    "horovod/runner/common/util/config_parser.py",  # ... and the HOROVOD_* variable behind each
    "vars.sh",  # Intel MPI's environment script
    "hadoop-functions.sh",  # Hadoop's
    "kubexec.sh",  # the Kubeflow MPI operator's script, written by benchmarks/bench_k8s.py
    "config/components/webhook/kustomization.yaml",  # in Kueue's repository
    "manifests/base/kubeflow.org_mpijobs.yaml",  # in mpi-operator's module source (build-mpi-operator.sh)
    "manifests/base/cluster-role.yaml",
    "build/base/Dockerfile",
    "train.py",
    "tf_cnn_benchmarks.py",  # a user's program in the examples
}
# a module quoted as code in prose: `lifecycle.run_job`, `core.exit_codes`, `base.REQUIRED()`
PROSE_MODULE_RE = re.compile(r"`([a-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
FILE_SUFFIXES = {"h", "py", "sh", "md", "toml", "j2", "yaml", "yml", "json", "cfg", "txt", "zip", "log", "pem"}

MODULE_RE = re.compile(r"(?<![\w./-])((?:mpilaunch|testbeds)(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
MOD_ROLE_RE = re.compile(r":mod:`~?([.\w]+)`")
# a path with at least one slash: word characters, dots and dashes per part
SLASH_PATH_RE = re.compile(r"(?<![\w./$~<>{}*-])((?:[A-Za-z_.][\w.-]*/)+(?:[\w-][\w.-]*)?)(?![\w/*<>{}$])")
BARE_FILE_RE = re.compile(r"(?<![\w./$~<>{}*-])([A-Za-z_][\w-]*\.(?:py|sh))(?![\w/*<>{}$-])")


def walk(part: str):
    path = ROOT / part
    if path.is_file():
        yield path
        return
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            p = Path(folder) / name
            if not p.is_symlink():
                yield p


@lru_cache(maxsize=None)
def repo_tails() -> frozenset:
    """Every file and folder of the repository as each tail of its path: ``backends/base.py``
    is there for mpilaunch/backends/base.py, and so are ``base.py`` and the folders."""
    tails = set()
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).parts
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and not (not rel and d in ROOT_OUTPUTS)
        ]
        for name in dirs + files:
            parts = rel + (name,)
            tails.update("/".join(parts[i:]) for i in range(len(parts)))
    return frozenset(tails)


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python or shell file."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return [
            (n, line.split("#", 1)[1])
            for n, line in enumerate(text.splitlines(), 1)
            if re.match(r"\s*#", line) or " # " in line
        ]
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                line = node.body[0].lineno
                out.append((line, doc))
    return out


def sources() -> list[tuple[Path, int, str]]:
    out = []
    for part in DOCS:
        for p in walk(part):
            if p.suffix == ".md":
                out.extend((p, n, line) for n, line in enumerate(p.read_text().splitlines(), 1))
    for part in CODE:
        for p in walk(part):
            if p == Path(__file__).resolve():  # its own examples of stale references
                continue
            if p.suffix in (".py", ".sh") or (p.parent.name == "scripts" and not p.suffix):
                out.extend((p, n, text) for n, text in comments_and_docstrings(p))
    return out


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_exists(dotted: str) -> bool:
    """`a.b.c` is a module, or module `a.b` defines `c`."""
    if module_file(dotted):
        return True
    parent, _, name = dotted.rpartition(".")
    source = module_file(parent) if parent else None
    return bool(source and re.search(rf"\b{re.escape(name)}\b", source.read_text()))


@lru_cache(maxsize=None)
def package_modules() -> dict[str, list[str]]:
    """Each module and package of mpilaunch by its own name: ``lifecycle`` -> [mpilaunch.job.lifecycle]."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "mpilaunch").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        out.setdefault(parts[-1], []).append(".".join(parts))
    return out


# dotted names in the docs that start like a module of ours but are none: Debian's MPI binaries
NOT_MODULES = {"mpirun.openmpi", "mpirun.mpich"}


def prose_module_exists(dotted: str) -> bool | None:
    """Whether `a.b.c`, a module quoted from anywhere in its package path, exists; None where
    its first part names no module of ours (`os.environ`, `self.options`: not a reference), or a
    part is camelCase, which no Python name of ours is (an MPIJob's `spec.slotsPerWorker`)."""
    first, *rest = dotted.split(".")
    candidates = package_modules().get(first)
    camel = any(part[:1].islower() and part != part.lower() for part in rest)
    if not candidates or rest[-1] in FILE_SUFFIXES or camel or dotted in NOT_MODULES:
        return None
    return any(module_exists(".".join([module, *rest])) for module in candidates)


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1])


def resolve_role(target: str, path: Path) -> str:
    if not target.startswith("."):
        return target
    level = len(target) - len(target.lstrip("."))
    package = package_of(path).split(".")
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join(package + [target.lstrip(".")])


def path_exists(ref: str, path: Path) -> bool:
    """From the root, from the naming file's folder, or as the tail of a repository path
    (ARCHITECTURE's tree names `templates/` under `k8s/`, the docs `backends/base.py`)."""
    ref = ref.rstrip(".")  # a sentence's full stop
    if ref in NOT_OURS or Path(ref).name in NOT_OURS:
        return True
    if "/" not in ref:
        return ref in repo_tails() or ref[: -len(".py")] in sys.stdlib_module_names
    return (path.parent / ref).exists() or ref.rstrip("/") in repo_tails()


def is_checked_path(ref: str, text: str, start: int) -> bool:
    """A repository path looks like one: it ends in a file suffix we keep, or it is a folder
    with a parent (`testbeds/ssh/`), or a single folder quoted as code (``launchers/``)."""
    ref = ref.rstrip(".")
    if ref.endswith(CHECKED_SUFFIXES):
        return True
    if not ref.endswith("/"):
        return False
    quoted = start > 0 and text[start - 1] == "`" and text[start + len(ref) : start + len(ref) + 1] == "`"
    return ref == ref.lower() and (ref.count("/") > 1 or quoted)


def references(path: Path, text: str) -> list[str]:
    """The stale references in one line or docstring, each as `kind: reference`."""
    stale = []
    for m in MOD_ROLE_RE.finditer(text):
        dotted = resolve_role(m.group(1), path)
        if not module_exists(dotted):
            stale.append(f":mod: {m.group(1)}")
    for m in MODULE_RE.finditer(text):
        dotted = m.group(1).rstrip(".")
        last = dotted.rpartition(".")[2]
        if last in FILE_SUFFIXES or last.isupper():  # a file name (mpilaunch.zip), a placeholder
            continue
        if not module_exists(dotted):
            stale.append(f"module {dotted}")
    # prose in the docs; BENCHMARKS.md's runs quote record fields (`hang.collection_s`), no modules
    if path.suffix == ".md" and path.name != "BENCHMARKS.md":
        for m in PROSE_MODULE_RE.finditer(text):
            if not m.group(1).startswith(("mpilaunch.", "testbeds.")) and prose_module_exists(m.group(1)) is False:
                stale.append(f"module {m.group(1)}")
    for m in SLASH_PATH_RE.finditer(text):
        ref = m.group(1)
        if ref.startswith((".", "..")) or not is_checked_path(ref, text, m.start(1)):
            continue
        if not path_exists(ref, path):
            stale.append(f"path {ref}")
    for m in BARE_FILE_RE.finditer(text):
        if not path_exists(m.group(1), path):
            stale.append(f"file {m.group(1)}")
    return stale


def stale_references() -> list[str]:
    found = []
    for path, line, text in sources():
        for ref in references(path, text):
            found.append(f"{path.relative_to(ROOT)}:{line}: {ref}")
    return sorted(set(found))


def test_every_reference_exists():
    stale = stale_references()
    assert not stale, "references to files or modules that do not exist:\n" + "\n".join(stale)


def test_a_stale_reference_is_found():
    """The scan can fail: references to what moved away are each reported."""
    here = ROOT / "mpilaunch" / "backends" / "k8s" / "backend.py"
    assert references(here, "see ``launchers/k8s.py`` and :mod:`.k8s_api`, yarn_tools.py") == [
        ":mod: .k8s_api",
        "path launchers/k8s.py",
        "file yarn_tools.py",
    ]
    assert references(here, "the pod runs mpilaunch.backends.k8s.launchr") == ["module mpilaunch.backends.k8s.launchr"]
    assert (
        references(
            here, ":mod:`.manifests`, mpilaunch.core.spec.JobSpec, backends/base.py, testbeds/ssh/, test_gang.py"
        )
        == []
    )


def test_a_module_named_in_prose_is_resolved():
    """The docs name modules from their package down (`job.lifecycle.run_job`, `lifecycle.run_job`);
    one renamed or gone is stale, a dotted name that is no module of ours (`os.environ`) is prose."""
    doc = ROOT / "ARCHITECTURE.md"
    assert (
        references(doc, "`job.lifecycle.run_job`, `lifecycle.make_rundir`, `mpi.WORKER_PATH_ENV`, `os.environ`") == []
    )
    assert references(doc, "`job.lifecycle.run_jobs` and `rank_lines.TOKEN_ENVS()`") == [
        "module job.lifecycle.run_jobs",
        "module rank_lines.TOKEN_ENVS",
    ]
