"""mpilaunch's own pieces, brought into a user's image that does not have mpilaunch.

    python3 -m mpilaunch.image_tools copy DEST

runs in an init container of every pod of a Kubernetes job whose ``--image``
is not the tools image (``--tools-image``, default: the mpilaunch image of
this version). It copies the package (Python sources only; what runs in a
pod is standard library) into DEST, an emptyDir the job's own containers
mount at ``TOOLS_DIR``, and writes there:

* ``bin/<name>`` for each entry point (rank wrapper, shim, in-cluster
  launcher, reaper, task starter): ``/bin/sh`` starting the image's
  ``python3 -IS`` with DEST on ``sys.path``. Only these processes import
  mpilaunch: the user's program gets its environment, PYTHONPATH and
  packages untouched.
* ``bin/check-image``: what the image lacks (``/bin/sh`` script; its one line
  goes to the container's termination message and stderr, exit 3).

Standard library only: it runs in the tools image, and its output in any image.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: where the job's containers see the tools (an emptyDir, read-only there)
TOOLS_DIR = "/opt/mpilaunch-tools"
#: the oldest python3 the pieces run on (checked by ``check-image``)
MIN_PYTHON = (3, 8)
#: the line ``check-image`` writes starts with this (the backend recognises it in a pod's status)
CHECK_MARK = "mpilaunch: the image"
#: exit status of a failed check (the container's, then mpilaunch's: allocation failed)
CHECK_EXIT = 3
ENTRY_POINTS = {
    "mpilaunch-rank": "mpilaunch.rank",
    "mpilaunch-rsh": "mpilaunch.rsh_agent.shim",
    "mpilaunch-launcher": "mpilaunch.launchers.k8s",
    "mpilaunch-reaper": "mpilaunch.launchers.reaper",
    "mpilaunch-task": "mpilaunch.task_starter",
}


def entry_point(name: str, tools_dir: str = TOOLS_DIR) -> str:
    """The path of an entry point in a container of a job in tools mode."""
    if name not in ENTRY_POINTS:
        raise KeyError(name)
    return f"{tools_dir}/bin/{name}"


def entry_script(module: str, tools_dir: str) -> str:
    """``/bin/sh`` running ``module.main()`` under the image's python3 (found on PATH when run)."""
    from shlex import quote

    body = (f"import sys\nsys.path.insert(0, {tools_dir!r})\nfrom {module} import main\n"
            "sys.exit(main())\n")
    return f"#!/bin/sh\nexec python3 -IS -c {quote(body)} \"$@\"\n"


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
line="{CHECK_MARK} ${{MPILAUNCH_IMAGE:-of this pod}} lacks $lacks"
echo "$line" >&2
echo "$line" >/dev/termination-log 2>/dev/null
exit {CHECK_EXIT}
"""


def _write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def copy_tools(dest: str, tools_dir: str = TOOLS_DIR) -> list[str]:
    """Copy the package and write the entry points into ``dest`` (seen as ``tools_dir``); the files written."""
    package = Path(__file__).resolve().parent
    target = Path(dest) / "mpilaunch"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(package, target, ignore=shutil.ignore_patterns(*IGNORED))
    # the job's containers mount the copy read-only: bytecode made now saves every rank wrapper
    # its compile, where the image's python3 is the tools image's version (others compile in memory)
    import compileall

    compileall.compile_dir(str(target), quiet=2, ddir=f"{tools_dir}/mpilaunch")
    bindir = Path(dest) / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, module in ENTRY_POINTS.items():
        _write_executable(bindir / name, entry_script(module, tools_dir))
        written.append(str(bindir / name))
    _write_executable(bindir / "check-image", check_script(tools_dir))
    written.append(str(bindir / "check-image"))
    return written


#: what a copy of the package leaves out (bytecode is made where it runs, by the python that runs it)
IGNORED = ("__pycache__", "*.pyc")


def package_files() -> list[tuple[str, Path]]:
    """(name relative to the package's parent, file) of every file a copy of the package holds, sorted."""
    import fnmatch

    package = Path(__file__).resolve().parent
    out = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package.parent)
        if path.is_file() and not any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in IGNORED):
            out.append((rel.as_posix(), path))
    return out


def zip_tools(dest: str, extra: dict[str, str] | None = None) -> str:
    """A zip of the package (``mpilaunch/...`` at its top, as ``copy_tools`` copies it) plus ``extra``
    files (name -> text); the same bytes for the same sources (fixed timestamps), written atomically."""
    import zipfile

    tmp = f"{dest}.tmp.{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        entries = [(name, path.read_bytes()) for name, path in package_files()]
        entries += [(name, text.encode()) for name, text in sorted((extra or {}).items())]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, dest)
    return dest


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (2, 3) or args[0] != "copy":
        print("usage: python3 -m mpilaunch.image_tools copy DEST [TOOLS_DIR]", file=sys.stderr)
        return 2
    written = copy_tools(args[1], args[2] if len(args) == 3 else TOOLS_DIR)
    print(f"mpilaunch tools: {len(written)} entry points in {args[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
