"""``mpilaunch agent``: the exec agent that runs inside each worker.

It replaces sshd for ``mpilaunch-rsh``: it listens on TCP, speaks TLS with
the job's certificate (``wire/tls.py``), authenticates each connection
with the job secret and every frame after that with a key of the session
(``wire/protocol.py``), runs ``/bin/sh -c CMD`` in a fresh session and
streams its stdio back.

Why it looks the way it does:

* One thread, one ``selectors`` loop.  Children are reaped centrally with
  ``waitpid(-1)`` because the agent is a child subreaper: daemonized
  descendants (``orted``/``prted`` call setsid and fork) are re-parented to
  the agent, and a per-child ``Popen.wait`` would race with that reaper.
* A session is "the leader's process group plus every descendant whose
  environment carries ``MPILAUNCH_SESSION=<id>``" (the environment survives
  setsid and double forks, the process group does not).  A session's EXIT is
  sent once the leader exited, its stdout/stderr reached EOF and no process
  of the session is left, so a daemonized orted keeps its shim (and mpirun's
  view of it) alive exactly as long as it lives.  A client that hangs up
  ends the session: everything in it is killed.
* The secret is read from a 0600 file or stdin, never from argv/environment,
  and is not passed to commands.
* It ends with what started it: ``--exit-with-pid`` (the local backend: that
  process is gone) or ``--exit-on-stdin-eof`` (the ssh backend: its stdin
  ends when the ssh session does, however that ends; sshd sends no SIGHUP
  to a session without a terminal).
* Agents listen on every address (YARN), so a connection that has not
  authenticated is cheap to refuse and short-lived: a few seconds to finish
  the handshake, a cap per peer and in all (``admission``).

Modules: ``core`` (event loop), ``connections`` (handshake + protocol),
``admission`` (per-peer limits on unauthenticated connections),
``pipes`` (a session's stdin, stdout and stderr to and from its client), ``supervision`` (sessions and their descendants),
``proctree`` (/proc reads), ``cli`` (``mpilaunch agent``).
"""

from .constants import SESSION_ENV, WORKER_ENV

__all__ = ["SESSION_ENV", "WORKER_ENV", "main"]


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(argv)
