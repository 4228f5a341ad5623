"""The launcher container of a detached YARN job (``--detach``): where its output goes, how it ends.

Attached, the submitting mpilaunch drains mpirun's output from the
key-value store and ends the application. Detached, nobody does either, so

* mpirun's lines go to this container's own stdout/stderr, which skein
  writes to ``launcher.log`` in the container's log directory: the
  NodeManager serves it while the job runs (``mpilaunch logs -f``) and keeps
  it after the job ended (or log aggregation does), so the output is bounded
  by nothing but the NodeManager's disk and never fills the ApplicationMaster;
* at the end, on every exit path, this container shuts the application down
  itself: final status SUCCEEDED or FAILED, and diagnostics carrying the exit
  code, the failure line and where this log is (``backends/yarn_outcome``).
  Shutting the application down ends every worker container, so their
  resources go back to the queue at once.
"""

from __future__ import annotations

import os
import sys
import time

from ....runtime import summary
from ..outcome import diagnostics


def to_container_log(stream: str, line: str) -> None:
    """One line of mpirun's output into this container's log, as it comes."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.write(line)
    out.flush()


def node_http_address() -> str | None:
    """This NodeManager's web address (YARN puts NM_HOST and NM_HTTP_PORT in every container's environment)."""
    host, port = os.environ.get("NM_HOST"), os.environ.get("NM_HTTP_PORT")
    return f"{host}:{port}" if host and port else None


def finish(app, exit_code: int, failure: str | None, report: dict | None = None) -> None:
    """Record the outcome and end the application (and with it every container, this one included).

    ``report``: the job's, where run_job built one: its closing summary ends this container's log
    (``mpilaunch logs``) and its facts (``summary.compact``) go into the diagnostics, which
    ``mpilaunch wait`` reads back and prints as the summary."""
    if exit_code != 0 and failure:
        print(f"mpilaunch: error: {failure}", file=sys.stderr, flush=True)
    print(
        f"mpilaunch: launcher: job ended with exit code {exit_code}; ending the YARN application, "
        f"which releases every container",
        file=sys.stderr,
        flush=True,
    )
    facts = None
    if report is not None:
        # the launch description's spec names no backend
        report = {**report, "exit_code": exit_code, "failure": failure, "backend": "yarn"}
        print("\n".join(summary.lines(report)), file=sys.stderr, flush=True)
        facts = summary.compact(report)
    app.shutdown(
        "SUCCEEDED" if exit_code == 0 else "FAILED",
        diagnostics=diagnostics(exit_code, failure, os.environ.get("CONTAINER_ID"), node_http_address(), facts),
    )


class WorkerContainers:
    """The worker containers as the ApplicationMaster sees them, asked from the launcher container.

    Attached, the submitting side watches for lost workers; detached, the
    launcher's own lifecycle does, through this, so a lost worker is named
    first (exit 5) in the outcome ``mpilaunch wait`` reports, as in every mode.
    """

    def __init__(self, app, plan, addresses: dict[str, str], secret_file):
        self.app = app
        self.plan = plan
        self.addresses = addresses
        self.secret_file = secret_file
        self.facts: dict[str, dict] = {}

    def refresh(self) -> bool:
        import skein

        from ..client import shorten, state_name

        try:
            containers = self.app.get_containers(services=["worker"], states=list(skein.model.ContainerState))
        except Exception:
            return False
        for c in containers:
            self.facts[self.plan.workers[c.instance].name] = {
                "container": c.yarn_container_id or None,
                "node": c.yarn_node_http_address or None,
                "state": state_name(c.state),
                "exit": shorten(c.exit_message, 300) or None,
            }
        return True

    def lost(self, settle: bool) -> dict[str, str]:
        """As ``yarn_report.lost_workers`` on the submitting side: ended containers, silent agents once settled."""
        from ...agent_workers import silent_agents
        from ..report import SETTLE_S, container_loss

        silent = silent_agents(self.addresses, self.secret_file) if settle else set()
        deadline = time.monotonic() + (SETTLE_S if silent else 0.0)
        while self.refresh():
            # an agent that died ends its container a little later: give YARN the time to say so
            if all(self.facts.get(n, {}).get("state") != "RUNNING" for n in silent) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        return {
            w.name: why
            for w in self.plan.workers
            if (why := container_loss(self.facts.get(w.name, {}), w.name in silent)) is not None
        }
