"""``mpilaunch status|logs|wait|delete|stacks NAME --backend yarn`` (``YarnNamedJob``): find the job's
applications and read them."""

from __future__ import annotations

import getpass
import json
import os

import skein

from ...core.errors import UsageError
from ..named_job import JobEntry, JobState, JobStatus, NamedJob
from . import handoff, outcome, stacks_kv
from .client import TAG, TERMINAL_STATES, application_security, is_mpilaunch, shorten, skein_client, state_name
from .keys import KV_PREFIX, SPEC_KEY


def current_user() -> str:
    """Who YARN takes us for, as Hadoop's UserGroupInformation decides with
    simple authentication: HADOOP_USER_NAME, else the operating system's
    name for our uid (not $USER)."""
    if os.environ.get("HADOOP_USER_NAME"):
        return os.environ["HADOOP_USER_NAME"]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return getpass.getuser()


def _all_apps(client, name: str) -> list:
    """Every application of that name, in any state, oldest first (an error if there is none)."""
    apps = client.get_applications(name=name, states=list(skein.model.ApplicationState))
    if not apps:
        raise UsageError(
            f"no YARN application named {name!r}",
            "check the name (mpilaunch --name) and that HADOOP_CONF_DIR points at the cluster",
        )
    return sorted(apps, key=lambda a: a.start_time or 0)


def _find_apps(client, name: str) -> list:
    """The applications of that name that mpilaunch submitted, oldest first; an
    error if there are none (an application of someone else's is never reported
    on as a job)."""
    return _ours(_all_apps(client, name), name)


def _ours(apps: list, name: str) -> list:
    ours = [a for a in apps if is_mpilaunch(a)]
    if not ours:
        ids = ", ".join(a.id for a in apps)
        raise UsageError(
            f"YARN application {name!r} ({ids}) is not an mpilaunch job: it has no {TAG!r} tag",
            "mpilaunch looks at and kills only the applications it submitted; see it with: yarn application -status ID",
        )
    return ours


class _OursOnly:
    """A skein client whose get_applications sees only mpilaunch's applications."""

    def __init__(self, client):
        self.skein_client = client

    def __getattr__(self, attr):
        return getattr(self.skein_client, attr)

    def get_applications(self, *args, **kwargs):
        return [a for a in self.skein_client.get_applications(*args, **kwargs) if is_mpilaunch(a)]


class YarnNamedJob(NamedJob):
    """The applications of job NAME that mpilaunch submitted (another tool's of the same name are
    never reported on as the job, nor killed), read from the ResourceManager and the NodeManagers;
    stacks taken by the job's launcher container (``stacks_kv``)."""

    poll_s = handoff.POLL_S

    def status(self) -> JobStatus:
        client = skein_client()
        try:
            apps = _all_apps(client, self.name)
            entries = []
            for report in _ours(apps, self.name):
                state = handoff.state_of(self.name, report)
                details = [f"diagnostics: {shorten(report.diagnostics, 300)}"] if report.diagnostics else []
                containers = _node_containers(client, report.id)
                details += [
                    f"{c.get('id')}  {_role(c):9s} on {c.get('nodeId')}  {c.get('state')}  exit={c.get('exitCode')}"
                    for c in containers
                ]
                if not containers and state.exit_code is not None:
                    details.append("no containers left: all released")
                entries.append(
                    JobEntry(
                        title=f"{report.id}  {report.name}",
                        state=state,
                        facts=f"state={state_name(report.state)} final={state_name(report.final_status)}"
                        f"  queue={report.queue}  user={report.user}",
                        details=details,
                    )
                )
            notes = [
                f"not listed: {report.id} ({state_name(report.state)}, user={report.user}), "
                f"of the same name but not an mpilaunch job"
                for report in apps
                if not is_mpilaunch(report)
            ]
        finally:
            client.close()
        return JobStatus(entries, notes)

    def state(self) -> JobState:
        client = skein_client()
        try:
            return handoff.state_of(self.name, handoff.find_app(client, self.name))
        finally:
            client.close()

    def logs(self, stream, follow: bool) -> None:
        _logs(self.name, stream, follow)

    def delete(self, stream) -> None:
        _delete(self.name, stream)

    def stacks(self, deadline_s: float):
        return _stacks(self.name, deadline_s)


def _logs(name: str, stream, follow: bool) -> None:
    client = skein_client()
    try:
        if follow:
            _find_apps(client, name)  # no such job, or not an mpilaunch one: say so at once
            handoff.follow(_OursOnly(client), name, stream, _node_containers, _http_text)
            return
        report = _find_apps(client, name)[-1]
        containers = _node_containers(client, report.id)
        ended_log = outcome.launcher_log(report.diagnostics) if not containers else None
        if ended_log:  # a detached job that ended: its launcher's log stays on the NodeManager
            container, node = ended_log
            text = _http_text(f"http://{node}/ws/v1/node/containerlogs/{container}/{outcome.LAUNCHER_LOG}")
            if text:
                print(f"==> {container} {outcome.LAUNCHER_LOG} <==", file=stream)
                text = outcome.log_contents(text)
                stream.write(text if text.endswith("\n") else text + "\n")
                return
        for c in containers:
            names = [
                f
                for f in c.get("containerLogFiles") or ["stdout", "stderr"]
                if f not in ("launch_container.sh", "directory.info")
            ]
            for log_name in names:
                text = _http_text(f"http://{c['_http']}/ws/v1/node/containerlogs/{c['id']}/{log_name}")
                if text:
                    print(f"==> {c['id']} {log_name} <==", file=stream)
                    stream.write(text if text.endswith("\n") else text + "\n")
        if not containers:
            try:
                logs = client.application_logs(report.id)
                stream.write(logs.dumps() if hasattr(logs, "dumps") else str(logs))
            except Exception as e:
                print(
                    f"no logs for {report.id}: the NodeManagers no longer hold them and "
                    f"log aggregation gave none ({shorten(str(e), 200)})",
                    file=stream,
                )
    finally:
        client.close()


def _delete(name: str, stream) -> None:
    """Kill the running applications of that name that mpilaunch submitted for
    this user; anyone else's (no mpilaunch tag, or another user's) is left
    alone, and when there is nothing else, nothing is killed (exit 2)."""
    client = skein_client()
    try:
        apps = _all_apps(client, name)
        ours = _ours(apps, name)  # none: refused, nothing killed
        user = current_user()
        mine = [a for a in ours if a.user == user]
        if not mine:
            owners = ", ".join(f"{a.id} submitted by {a.user}" for a in ours)
            raise UsageError(
                f"YARN application {name!r} is not yours to delete ({owners}; you are {user})",
                "mpilaunch delete kills only your own jobs; ask their owner or a YARN administrator",
            )
        for report in mine:
            if state_name(report.state) not in TERMINAL_STATES:
                client.kill_application(report.id)
                print(f"killed {report.id} ({report.name})", file=stream)
            else:
                print(f"{report.id} already {state_name(report.state)}", file=stream)
        killed = {a.id for a in mine}
        for report in apps:
            if report.id not in killed and state_name(report.state) not in TERMINAL_STATES:
                why = f"submitted by {report.user}" if is_mpilaunch(report) else "not an mpilaunch job"
                print(f"left {report.id} ({report.name}) {state_name(report.state)}: {why}", file=stream)
    finally:
        client.close()


def _stacks(name: str, deadline_s: float):
    """Every rank's stacks of a running job, taken by its launcher container (``stacks_kv``): a
    ``hang.collect.Collection``. A UsageError, with a hint, for a job that ended, is not running yet,
    is someone else's, has no launcher container, or whose launcher did not answer in time."""
    from ...hang.collect import Collection

    logs_hint = f"a hang diagnosed at --timeout or --stall-timeout is in its launcher's log: mpilaunch logs {name}"
    client = skein_client()
    try:
        report = handoff.find_app(client, name)
        state = state_name(report.state)
        if state in TERMINAL_STATES:
            raise UsageError(f"job {name} ({report.id}) has ended ({handoff.state_of(name, report).phase})", logs_hint)
        if state != "RUNNING":
            raise UsageError(
                f"job {name} ({report.id}) is not running yet ({state})",
                f"ask again once `mpilaunch status {name} --backend yarn` says RUNNING",
            )
        if report.user != current_user():
            raise UsageError(
                f"job {name} ({report.id}) was submitted by {report.user}; you are {current_user()}",
                "only a job's owner reaches its launcher (through the application's own credentials)",
            )
        app = client.connect(report.id, wait=False, security=application_security(report.id))
        try:
            if not app.kv.exists(KV_PREFIX + SPEC_KEY):
                raise UsageError(
                    f"job {name} ({report.id}) has no launcher container running it in the cluster",
                    "a job run with --launcher local is reached only where its mpilaunch runs: run "
                    f"`mpilaunch stacks {name} --backend yarn` there",
                )
            found, seconds = stacks_kv.ask(app.kv, KV_PREFIX, deadline_s)
        except (stacks_kv.ReplyError, ValueError) as e:
            raise UsageError(f"job {name}: its launcher took no stacks: {e}", logs_hint) from None
        except (stacks_kv.NoReply, ConnectionError, skein.exceptions.SkeinError) as e:
            if state_name(handoff.find_app(client, name).state) in TERMINAL_STATES:
                raise UsageError(f"job {name} ({report.id}) ended while its stacks were asked for", logs_hint) from None
            raise UsageError(
                f"job {name} ({report.id}): its launcher did not answer ({shorten(str(e), 200)})",
                f"is the job still starting? `mpilaunch status {name} --backend yarn`; {logs_hint}",
            ) from None
        finally:
            app.close()
    except skein.exceptions.ApplicationNotRunningError:
        raise UsageError(f"job {name} is no longer running", logs_hint) from None
    finally:
        client.close()
    return Collection(found, {}, seconds)


def _role(container: dict) -> str:
    """launcher, worker or appmaster, by the log file skein writes for the container's service."""
    files = container.get("containerLogFiles") or ()
    for name in files:
        if name.endswith(".log") and name[:-4] in ("launcher", "worker"):
            return name[:-4]
    return "appmaster" if container.get("id", "").endswith("_000001") else "?"


def _http_text(url: str) -> str | None:
    import urllib.request

    try:
        req = urllib.request.Request(url, headers={"Accept": "application/json, text/plain"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _node_containers(client, app_id: str) -> list[dict]:
    """The application's containers as the NodeManagers still report them."""
    suffix = "container_" + app_id.split("_", 1)[-1] + "_"
    out = []
    for node in client.get_nodes():
        text = _http_text(f"http://{node.http_address}/ws/v1/node/containers")
        try:
            items = ((json.loads(text or "{}").get("containers") or {}).get("container")) or []
        except ValueError:
            continue
        for c in [items] if isinstance(items, dict) else items:
            if c.get("id", "").startswith(suffix):
                out.append(dict(c, _http=node.http_address))
    return sorted(out, key=lambda c: c["id"])
