"""``mpilaunch status|logs|delete NAME --backend yarn``: find the job's applications and read them."""

from __future__ import annotations

import json

import skein

from ..errors import UsageError
from .yarn_client import TERMINAL_STATES, _client, _short, _state


def _find_apps(client, name: str) -> list:
    apps = client.get_applications(name=name, states=list(skein.model.ApplicationState))
    if not apps:
        raise UsageError(f"no YARN application named {name!r}",
                         "check the name (mpilaunch --name) and that HADOOP_CONF_DIR points at the cluster")
    return sorted(apps, key=lambda a: a.start_time or 0)

def status(args, stream) -> int:
    client = _client()
    try:
        for report in _find_apps(client, args.name):
            print(f"{report.id}  {report.name}  state={_state(report.state)} "
                  f"final={_state(report.final_status)}  queue={report.queue}  user={report.user}", file=stream)
            if report.diagnostics:
                print(f"  diagnostics: {_short(report.diagnostics, 300)}", file=stream)
            for c in _node_containers(client, report.id):
                print(f"  {c.get('id')}  on {c.get('nodeId')}  {c.get('state')}"
                      f"  exit={c.get('exitCode')}", file=stream)
    finally:
        client.close()
    return 0

def logs(args, stream) -> int:
    client = _client()
    try:
        report = _find_apps(client, args.name)[-1]
        containers = _node_containers(client, report.id)
        for c in containers:
            names = [f for f in c.get("containerLogFiles") or ["stdout", "stderr"]
                     if f not in ("launch_container.sh", "directory.info")]
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
                print(f"no logs for {report.id}: the NodeManagers no longer hold them and "
                      f"log aggregation gave none ({_short(str(e), 200)})", file=stream)
    finally:
        client.close()
    return 0

def delete(args, stream) -> int:
    client = _client()
    try:
        for report in _find_apps(client, args.name):
            if _state(report.state) not in TERMINAL_STATES:
                client.kill_application(report.id)
                print(f"killed {report.id} ({report.name})", file=stream)
            else:
                print(f"{report.id} already {_state(report.state)}", file=stream)
    finally:
        client.close()
    return 0


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
