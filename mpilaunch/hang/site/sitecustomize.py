"""mpilaunch's stacks handler, armed in every Python a rank starts (the no-tool fallback of issue 42).

The rank wrapper (``mpilaunch.rank``) puts this directory first on the
program's PYTHONPATH, so Python imports this module at start (``site``).
It arms ``faulthandler`` on one real-time signal: on that signal the
interpreter writes every thread's Python stack, from inside the signal
handler (in C, so also while the program waits in MPI), into an unlinked
file it holds open. The hang probe (``hang/probe.py``) finds that file in
/proc/PID/fd, sends the signal and reads the dump: no py-spy, no ptrace,
nothing in the image but the program's own Python. Where py-spy is there
and allowed, the probe uses py-spy and never sends the signal.

It then takes its directory off sys.path and PYTHONPATH (the program sees
the user's path, and a Python the program starts arms nothing), and runs the
sitecustomize this one hides (the next one on sys.path:
Debian's, a virtualenv's, the user's own), as Python would have.

Written for any Python the program may be (no f-strings: a Python 2 one
gets through it too), and silent: a failure only leaves the handler out.
"""

import os
import sys

# hang/probe.py's STACKS_SIGNAL_FROM_MAX and STACKS_FILE_MARK
_SIGNAL_FROM_MAX = 3
_FILE_MARK = "mpilaunch-stacks-"


def _stacks_file():
    """A file nobody else can open by name: a memfd (no writable directory needed: a read-only
    root filesystem still has one), or an unlinked file in $TMPDIR on a Python without memfd."""
    name = _FILE_MARK + str(os.getpid())
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name)  # close-on-exec: a program the rank execs does not inherit it
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd


def _arm():
    import _signal  # the C half of signal: without the enum module signal imports
    import faulthandler

    signum = _signal.SIGRTMAX - _SIGNAL_FROM_MAX
    if _signal.getsignal(signum) != _signal.SIG_DFL:
        return  # the signal is taken already: this program's, not ours
    stream = os.fdopen(_stacks_file(), "wb", 0)
    # chain=False: a chained handler re-raises the signal with its previous action, the default
    # one here, which ends the process. all_threads: the main thread is the one that matters,
    # and the signal may land on any.
    faulthandler.register(signum, file=stream, all_threads=True, chain=False)  # it holds on to stream


def _chain():
    """Import the next sitecustomize on sys.path under this name, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        from importlib.machinery import PathFinder
    except ImportError:  # Python 2
        return
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = type(sys)("sitecustomize")  # importlib.util.module_from_spec, without importing importlib.util
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _hide():
    """Take this directory off sys.path and PYTHONPATH again: the program, and any Python it
    starts, see the path the user gave (the handler is armed in this process already)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if entries and entries[0] and os.path.abspath(entries[0]) == here:
        rest = os.pathsep.join(entries[1:])
        if rest:
            os.environ["PYTHONPATH"] = rest
        else:
            del os.environ["PYTHONPATH"]


try:
    _arm()
except Exception:  # no faulthandler, no real-time signals, no memfd nor writable TMPDIR
    pass
_hide()
_chain()  # the hidden sitecustomize's own errors are its own: site reports them as it would
