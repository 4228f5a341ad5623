"""mpilaunch's own pieces, for a container whose image does not have mpilaunch.

On Kubernetes every job's pods mount them from a ConfigMap of the job
(``backends/k8s/tools.py``) at ``TOOLS_DIR``, as these files (``tools_files``):

* ``mpilaunch.zip``: the package (Python sources; what runs in a pod is
  standard library) and bytecode of the modules the pieces import as they
  start, made by the submitting interpreter (``bytecode``: zipimport takes it
  where the pod's Python is of the same version, the sources elsewhere),
  imported from the zip (zipimport) by
* ``<name>`` for each entry point (rank wrapper, shim, in-cluster launcher,
  reaper, task starter): ``/bin/sh`` starting the image's ``python3 -IS``
  with the zip on ``sys.path``. Only these processes import mpilaunch: the
  user's program gets its environment, PYTHONPATH and packages untouched.
* ``check-image``: what the image lacks (``/bin/sh``; its one line goes to
  the container's termination message and stderr, exit 3).

On YARN an ``--env-archive``'s containers get the same zip as a localized
archive (``backends/yarn/tools.py``). ``python3 -m mpilaunch.runtime.image_tools
write DEST`` writes the files into DEST (what a pod sees).

Standard library only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core import env_names
from ..core.exit_codes import EXIT_ALLOCATION, EXIT_USAGE

#: where the job's containers see the tools (a ConfigMap volume, read-only)
TOOLS_DIR = "/opt/mpilaunch-tools"
#: the package's zip in that directory
ZIP_NAME = "mpilaunch.zip"
#: the oldest python3 the pieces run on (checked by ``check-image``)
MIN_PYTHON = (3, 8)
#: the line ``check-image`` writes starts with this (the backend recognises it in a pod's status)
CHECK_MARK = "mpilaunch: the image"
#: exit status of a failed check (the container's, then mpilaunch's: allocation failed)
CHECK_EXIT = EXIT_ALLOCATION
ENTRY_POINTS = {
    "mpilaunch-rank": "mpilaunch.rank",
    "mpilaunch-rsh": "mpilaunch.rsh_agent.shim",
    "mpilaunch-agent": "mpilaunch.agent.cli",
    "mpilaunch-launcher": "mpilaunch.backends.k8s.in_cluster.launcher",
    "mpilaunch-reaper": "mpilaunch.backends.k8s.in_cluster.reaper",
}
#: entry points that are a container's PID 1, which ignores SIGTERM until it has a handler: until
#: their module sets its own, SIGTERM ends them. A reaper still importing when a short job was
#: released held the release for its pod's 2 s grace period (the job's pods are deleted together).
ENDS_ON_SIGTERM_FROM_START = ("mpilaunch-reaper", "mpilaunch-agent")


def entry_point(name: str, tools_dir: str = TOOLS_DIR) -> str:
    """The path of an entry point in a job's container."""
    if name not in ENTRY_POINTS:
        raise KeyError(name)
    return f"{tools_dir}/{name}"


def entry_script(module: str, package_path: str, ends_on_sigterm: bool = False) -> str:
    """``/bin/sh`` running ``module.main()`` under the image's python3 (found on PATH when run),
    the package imported from ``package_path`` (the zip, or a directory holding ``mpilaunch/``).
    ``ends_on_sigterm``: SIGTERM ends it (exit 0) from its first line, before the imports."""
    from shlex import quote

    early = "import signal\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n" if ends_on_sigterm else ""
    body = f"import sys\n{early}sys.path.insert(0, {package_path!r})\nfrom {module} import main\nsys.exit(main())\n"
    return f'#!/bin/sh\nexec python3 -IS -c {quote(body)} "$@"\n'


def check_script(tools_dir: str) -> str:
    """``check-image ROLE [MPIRUN]``: exit 0, or one line naming what the image lacks and exit 3.

    Both roles need python3 (the rank wrapper, the launcher) and an MPI: the
    launcher MPIRUN (``--mpirun``) if given, else, as the workers (whose MPI
    daemons come from the same installation), ``mpirun`` or ``mpiexec`` on PATH.
    """
    need = "%d.%d" % MIN_PYTHON
    return f"""#!/bin/sh
# written by mpilaunch (image_tools.py): what this image lacks for mpilaunch
role="$1" mpirun="$2" lacks=""
if ! command -v python3 >/dev/null 2>&1; then
  lacks="python3 ({need} or newer) on PATH"
elif ! python3 -c 'import sys; sys.exit(sys.version_info < {MIN_PYTHON!r})' 2>/dev/null; then
  lacks="python3 {need} or newer (it has $(python3 -V 2>&1))"
fi
if [ -z "$lacks" ]; then
  if [ -n "$mpirun" ] && [ "$role" = launcher ]; then
    command -v "$mpirun" >/dev/null 2>&1 || lacks="the MPI launcher $mpirun (--mpirun)"
  elif ! command -v mpirun >/dev/null 2>&1 && ! command -v mpiexec >/dev/null 2>&1; then
    lacks="an MPI: no mpirun or mpiexec on PATH ($PATH)"
  fi
fi
[ -z "$lacks" ] && exit 0
line="{CHECK_MARK} ${{{env_names.IMAGE}:-of this pod}} lacks $lacks"
echo "$line" >&2
echo "$line" >/dev/termination-log 2>/dev/null
exit {CHECK_EXIT}
"""


def tools_files(tools_dir: str = TOOLS_DIR) -> dict[str, bytes]:
    """Every file a job's container sees in ``tools_dir``: the zip, the entry points, the check."""
    files = {ZIP_NAME: package_zip()}
    for name, module in ENTRY_POINTS.items():
        files[name] = entry_script(
            module, f"{tools_dir}/{ZIP_NAME}", ends_on_sigterm=name in ENDS_ON_SIGTERM_FROM_START
        ).encode()
    files["check-image"] = check_script(tools_dir).encode()
    return files


def write_tools(dest: str, tools_dir: str | None = None) -> list[str]:
    """Write ``tools_files`` into ``dest`` (seen as ``tools_dir``, default ``dest``), executables 0755."""
    written = []
    Path(dest).mkdir(parents=True, exist_ok=True)
    for name, data in tools_files(tools_dir or dest).items():
        path = Path(dest) / name
        path.write_bytes(data)
        os.chmod(path, 0o644 if name == ZIP_NAME else 0o755)
        written.append(str(path))
    return written


#: the zip's size past which no more bytecode goes in: a ConfigMap holds at most 1 MiB (its
#: binaryData counted raw), and the sources alone are ~0.5 MB
BYTECODE_BUDGET = 1_000_000


def started_modules() -> list[str]:
    """The package's modules the entry points import as they start, in the order imported (the rank
    wrapper's first: it starts once per rank), found by importing them in a bare interpreter."""
    import subprocess

    parent = str(Path(__file__).resolve().parent.parent.parent)
    code = (
        "import sys\nsys.path.insert(0, sys.argv[1])\n"
        f"for name in {list(ENTRY_POINTS.values())!r}:\n    __import__(name)\n"
        "print(' '.join(m for m in sys.modules if m == 'mpilaunch' or m.startswith('mpilaunch.')))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-IS", "-c", code, parent], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def bytecode(source: bytes, filename: str) -> bytes:
    """``source`` compiled by this interpreter, as a .pyc that is never checked against its source
    (PEP 552's unchecked hash: the zip's entries have no usable mtime). An interpreter of another
    version sees another magic number and compiles the source beside it instead."""
    import importlib.util
    import marshal

    code = compile(source, filename, "exec", dont_inherit=True)
    unchecked_hash = (1).to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + unchecked_hash + importlib.util.source_hash(source) + marshal.dumps(code)


#: what a copy of the package leaves out: bytecode (made where it runs, by the python that runs it)
#: and templates (rendered on the submitting side only)
IGNORED_DIRS = ("__pycache__",)
IGNORED_SUFFIXES = (".pyc", ".j2")


def package_files() -> list[tuple[str, Path]]:
    """(name relative to the package's parent, file) of every file a copy of the package holds, sorted.

    os.walk, pruning ``__pycache__``: a glob of the whole tree matched against patterns took 30 ms
    of each Kubernetes launch once the package was byte-compiled (a .pyc beside every module)."""
    package = Path(__file__).resolve().parent.parent  # mpilaunch/, this file being mpilaunch/runtime/image_tools.py
    parent = len(str(package.parent)) + 1
    out = []
    for root, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS]
        for name in names:
            if not name.endswith(IGNORED_SUFFIXES):
                path = os.path.join(root, name)
                out.append((path[parent:].replace(os.sep, "/"), Path(path)))
    return sorted(out)


def zip_bytes() -> bytes:
    """A zip of the package (``mpilaunch/...`` at its top) and the bytecode of its started modules;
    the same bytes for the same sources and interpreter (fixed timestamps)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        sources = {name: path.read_bytes() for name, path in package_files()}
        for name, data in sources.items():
            _write(z, name, data)
        if os.environ.get(env_names.TOOLS_BYTECODE, "1") != "0":
            _write_bytecode(z, buffer, sources)
    return buffer.getvalue()


def _write(z, name: str, data: bytes) -> None:
    import zipfile

    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, data)


def _write_bytecode(z, buffer, sources: dict[str, bytes]) -> None:
    """A .pyc beside the source of each started module, while the zip stays under the budget:
    a piece imported from sources compiles each module it imports, every time (the in-cluster
    launcher's imports: 0.29 s of CPU from sources, 0.11 s with bytecode)."""
    import zlib

    # the central directory, written at the end: 46 bytes and the name per entry, and the end record's 22
    directory = sum(46 + len(i.filename) for i in z.infolist()) + 22
    for module in started_modules():
        path = module.replace(".", "/")
        name = f"{path}/__init__.py" if f"{path}/__init__.py" in sources else f"{path}.py"
        if name not in sources:
            continue
        pyc, pyc_name = bytecode(sources[name], name), name[:-3] + ".pyc"
        directory += 46 + len(pyc_name)
        # the entry itself: its local header (~30 bytes and the name) and the compressed bytecode
        if buffer.tell() + 30 + len(pyc_name) + len(zlib.compress(pyc)) + directory > BYTECODE_BUDGET:
            return
        _write(z, pyc_name, pyc)


def package_zip() -> bytes:
    """``zip_bytes()``, kept between launches in the user's cache under a key made of every
    package file's name, size and mtime: compressing the package cost each Kubernetes launch
    25 ms before its first object was created; listing the files for the key costs 4 ms."""
    import hashlib

    from ..core.mpi import versions

    files = package_files()
    # the bytecode is this interpreter's: another version (a venv rebuilt) makes another zip
    made_by = (sys.implementation.cache_tag, os.environ.get(env_names.TOOLS_BYTECODE, "1") != "0")
    key = hashlib.sha256(
        repr(
            [
                made_by,
                *((name, st.st_size, st.st_mtime_ns) for name, st in ((name, path.stat()) for name, path in files)),
            ]
        ).encode()
    ).hexdigest()[:24]
    try:
        directory = versions.cache_dir("tools")
    except OSError:  # no writable cache: compressed each time
        return zip_bytes()
    cached = os.path.join(directory, f"mpilaunch-{key}.zip")
    try:
        with open(cached, "rb") as f:
            return f.read()
    except OSError:
        pass
    data = zip_bytes()
    try:
        for old in os.listdir(directory):  # one package at a time: the old ones go
            if old.startswith("mpilaunch-") and old.endswith(".zip"):
                os.unlink(os.path.join(directory, old))
        tmp = f"{cached}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, cached)
    except OSError:  # no writable cache: compressed again next time
        pass
    return data


def zip_tools(dest: str, extra: dict[str, str] | None = None) -> str:
    """``package_zip`` (the cached one) with ``extra`` files added, written to ``dest`` atomically."""
    import io
    import zipfile

    buffer = io.BytesIO(package_zip())
    buffer.seek(0, io.SEEK_END)
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as z:
        for name, text in sorted((extra or {}).items()):
            _write(z, name, text.encode())
    tmp = f"{dest}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
    os.replace(tmp, dest)
    return dest


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3) or args[0] != "write":
        print("usage: python3 -m mpilaunch.runtime.image_tools write DEST [TOOLS_DIR]", file=sys.stderr)
        return EXIT_USAGE
    written = write_tools(args[1], args[2] if len(args) == 3 else None)
    print(f"mpilaunch tools: {len(written)} files in {args[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
