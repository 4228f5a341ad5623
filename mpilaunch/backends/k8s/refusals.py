"""What a namespace's policy said when it refused an object, in one line (pure).

The API server answers 403 Forbidden for a permission that is missing, but
also for a ResourceQuota that is exceeded or requires limits, a LimitRange
whose minimum, maximum or ratio a container breaks, and a PodSecurity level
a pod violates. "Your credentials lack a permission" is wrong for all but
the first: these name the policy, the resource and what to change.
"""

from __future__ import annotations

import re

_EXCEEDED = re.compile(
    r"exceeded quota: ([^,]+), requested: ([^,]+(?:,[^,=]+=[^,]+)*?), "
    r"used: ([^,]+(?:,[^,=]+=[^,]+)*?), limited: (.*)$"
)
_FAILED = re.compile(r"failed quota: ([^:]+): (.*)$")
_POD_SECURITY = re.compile(r'violates PodSecurity "([^"]+)": (.*)$')
# LimitRange (LimitRanger admission): "minimum cpu usage per Container is 50m, but request is 10m",
# "maximum memory usage per Pod is 1Gi, but limit is 2Gi", "cpu max limit to request ratio per Container is 2, ..."
_LIMIT_RANGE = re.compile(
    r"((?:minimum|maximum) \S+ usage per \S+ is .*|[\w./-]+ max limit to request ratio per \S+ is .*)"
)

QUOTA_HINT = (
    "set requests and limits that fit the quota: --pod-cpu/--pod-memory (workers), "
    "--launcher-cpu/--launcher-memory, --reaper-cpu/--reaper-memory; kubectl describe resourcequota "
    "shows what is used"
)
LIMIT_RANGE_HINT = (
    "set requests and limits within the namespace's LimitRange: --pod-cpu/--pod-memory, "
    "--launcher-cpu/--launcher-memory, --reaper-cpu/--reaper-memory; kubectl describe limitrange "
    "shows its bounds"
)
POD_SECURITY_HINT = (
    "mpilaunch's pods meet 'restricted' unless told otherwise: check --run-as-user (not root) "
    "and the securityContext of your --pod-template"
)


def explain(message: str) -> tuple[str, str] | None:
    """``(what refused it and why, hint)`` for a policy's refusal, None for anything else."""
    text = " ".join(message.split())
    m = _EXCEEDED.search(text)
    if m:
        return (
            f"the namespace's ResourceQuota {m.group(1).strip()!r} is exceeded: requested {m.group(2).strip()}, "
            f"already used {m.group(3).strip()}, limited to {m.group(4).strip()}",
            QUOTA_HINT,
        )
    m = _FAILED.search(text)
    if m:
        return f"the namespace's ResourceQuota {m.group(1).strip()!r} refuses it: {m.group(2).strip()}", QUOTA_HINT
    m = _POD_SECURITY.search(text)
    if m:
        return f"the namespace's PodSecurity level {m.group(1)} refuses it: {m.group(2).strip()}", POD_SECURITY_HINT
    m = _LIMIT_RANGE.search(text)
    if m:
        return f"the namespace's LimitRange refuses it: {m.group(1).strip().rstrip(']')}", LIMIT_RANGE_HINT
    return None


def dry_run_pods(objects: list[tuple[str, dict]]) -> list[dict]:
    """One pod of each kind the job will make (a worker, and the launcher's and reaper's from their
    Jobs' templates), to create with ``dryRun=All``: admission (PodSecurity, LimitRange, quota)
    answers for them before anything is created. A Job's own creation only warns about its pods."""
    out, kinds = [], set()
    for group, obj in objects:
        if group not in ("workers", "launcher", "reaper") or group in kinds:
            continue
        kinds.add(group)
        if obj["kind"] == "Pod":
            out.append(obj)
        else:
            template = obj["spec"]["template"]
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        **template.get("metadata", {}),
                        "name": f"{obj['metadata']['name']}-check",
                        "namespace": obj["metadata"]["namespace"],
                    },
                    "spec": template["spec"],
                }
            )
    return out
