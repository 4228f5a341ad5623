"""Runs in a worker (sent as text, ``python3 -c``): lists the files --collect's globs match, and sends them.

Standard library only and Python 3.6 syntax: it runs with whatever python3 the
worker's image has, as the stacks probe does (``hang/probe.py``).

``list {"globs", "cwd"}``: relative globs start in ``cwd``, the directory the
worker's ranks ran in (their start lines said; MPI chose it), else where the
exec session started ("here" below). One JSON line ``{"cwd", "files": [{"path", "name", "size", "real"}],
"skipped": [{"path", "why"}], "unmatched": [glob]}``. A relative glob is taken
from here and its files are named relative to here; an absolute one names its
files by their path without the leading '/'. A directory matched brings the
files under it. A symbolic link is followed only where it stays inside the
directory the glob starts from (here, or an absolute glob's directory before
its first wildcard): one out of it is skipped, with why.

``send ITEMS``: ITEMS is ``[[path, offset, length], ...]``; for each, on stdout,
one status byte (0: data follows; 1: an error message follows), an 8-byte
big-endian length and that many bytes.
"""

import glob
import json
import os
import stat
import struct
import sys

WILDCARDS = "*?["


def root_of(pattern, cwd):
    """The directory a glob starts from: here for a relative one, else its part before any wildcard."""
    if not os.path.isabs(pattern):
        return cwd
    parts = pattern.split("/")
    fixed = []
    for part in parts[:-1]:
        if any(c in part for c in WILDCARDS):
            break
        fixed.append(part)
    return os.path.realpath("/".join(fixed) or "/")


def inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def candidates(match):
    """The match itself, or the files under a directory matched (links to directories not entered)."""
    if os.path.isdir(match) and not os.path.islink(match):
        for top, dirs, files in os.walk(match):
            dirs.sort()
            for d in dirs:  # not entered: the caller says why where one leads out
                if os.path.islink(os.path.join(top, d)):
                    yield os.path.join(top, d)
            for f in sorted(files):
                yield os.path.join(top, f)
    else:
        yield match


def list_files(globs, cwd):
    out = {"cwd": cwd, "files": [], "skipped": [], "unmatched": []}
    seen = set()
    for pattern in globs:
        absolute = os.path.isabs(pattern)
        root = root_of(pattern, cwd)
        matches = sorted(glob.glob(pattern if absolute else os.path.join(cwd, pattern), recursive=True))
        if not matches:
            out["unmatched"].append(pattern)
            continue
        for match in matches:
            for path in candidates(match):
                path = os.path.normpath(path)
                real = os.path.realpath(path)
                shown = path if absolute else os.path.relpath(path, cwd)
                if real in seen:
                    continue
                seen.add(real)
                if not inside(real, root):
                    why = "a symbolic link out of " if os.path.islink(path) or real != path else "outside "
                    out["skipped"].append({"path": path, "why": why + root})
                    continue
                try:
                    st = os.stat(real)
                except OSError as e:
                    out["skipped"].append({"path": path, "why": e.strerror or str(e)})
                    continue
                if stat.S_ISDIR(st.st_mode):
                    continue  # a link to a directory inside: its own files match a glob of their own
                if not stat.S_ISREG(st.st_mode):
                    out["skipped"].append({"path": path, "why": "not a regular file"})
                    continue
                name = path.lstrip("/") if absolute else shown
                out["files"].append({"path": path, "name": name, "size": st.st_size, "real": real})
    return out


def send(items, sink):
    for path, offset, length in items:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError as e:
            message = (e.strerror or str(e)).encode("utf-8", "replace")
            sink.write(b"\1" + struct.pack(">Q", len(message)) + message)
            continue
        sink.write(b"\0" + struct.pack(">Q", len(data)))
        sink.write(data)
    sink.flush()


def main(argv):
    mode, arg = argv[0], json.loads(argv[1])
    if mode == "list":
        if arg.get("cwd") and os.path.isdir(arg["cwd"]):
            os.chdir(arg["cwd"])
        cwd = os.path.realpath(os.getcwd())
        print(json.dumps(list_files(arg["globs"], cwd)))
    elif mode == "send":
        send(arg, sys.stdout.buffer)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main(sys.argv[1:])
