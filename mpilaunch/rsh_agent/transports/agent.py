"""Transport through ``mpilaunch agent`` (local, ssh and YARN backends; Kubernetes with ``--transport agent``).

Context keys: ``secret_file``, ``forward_env`` (names of the shim's
variables the remote command gets), ``cwd``, ``connect_timeout``,
``signal_grace``; ``secret_shared_ok`` (the secret is a Kubernetes Secret
volume's file), ``refused_wait`` (seconds a refused connection is tried
again: a pod is Ready a moment before its agent listens). Each worker entry
has ``address`` (HOST:PORT).
"""

import os

from mpilaunch.rsh_agent import agent_client

# After relaying SIGINT/SIGTERM/SIGHUP, wait this long for the remote side to
# exit, then hang up so the agent kills the rest (ssh would just die).
SIGNAL_GRACE = 3.0


def forwarded_env(context: dict) -> dict:
    """The shim's own values of the variables the context asks to forward."""
    names = context.get("forward_env") or ()
    return {name: os.environ[name] for name in names if name in os.environ}


def run(context: dict, worker: dict, command: str) -> int:
    secret = agent_client.read_secret(context["secret_file"], bool(context.get("secret_shared_ok")))
    return agent_client.run_command(
        worker["address"],
        secret,
        command,
        env=forwarded_env(context),
        cwd=context.get("cwd") or None,
        stdin=0,
        stdout=1,
        stderr=2,
        connect_timeout=float(context.get("connect_timeout", agent_client.DEFAULT_CONNECT_TIMEOUT)),
        forward_signals=True,
        hangup_after_signal=float(context.get("signal_grace", SIGNAL_GRACE)),
        refused_wait=float(context.get("refused_wait", 0)),
    )


def capture(context: dict, worker: dict, command: str, timeout: float):
    """Run ``command`` in the worker without stdin, collecting its output: ``(status, stdout, stderr)``
    bytes; TimeoutError past ``timeout`` seconds (the hang probe's channel, ``hang.collect``)."""
    secret = agent_client.read_secret(context["secret_file"], bool(context.get("secret_shared_ok")))
    # the agent's own environment: the shim's forwarded PATH would hide the worker's py-spy.
    # A refused connection is waited out as the shims do: the program check and --preflight ask
    # a worker the moment its pod is Ready, before its agent listens (seen on real pods: the
    # check took "refused" for no answer, 2 runs in 4, and the ranks ran a missing program)
    return agent_client.run_capture(
        worker["address"],
        secret,
        command,
        timeout=timeout,
        connect_timeout=max(0.5, min(5.0, timeout)),
        refused_wait=min(float(context.get("refused_wait", 0)), timeout),
    )
