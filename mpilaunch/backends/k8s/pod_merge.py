"""--pod-template FILE: a role's template merged into the pod mpilaunch renders (``apply``; pure).

The file is read and resolved per role by :mod:`.pod_template`.

How a role's template meets mpilaunch's pod (``apply``):

- appended: tolerations, imagePullSecrets, topologySpreadConstraints, volumes,
  initContainers and extra containers (they get mpilaunch's container
  securityContext under their own, so that PodSecurity "restricted" admits
  them), and the main container's env, envFrom, volumeMounts and ports;
- merged, a clash refused: labels, annotations, nodeSelector (mpilaunch's
  come from flags or mean something: --gang, --queue, the job's selector);
  the ``mpilaunch/`` label and annotation prefix is mpilaunch's alone;
- merged, the template wins: securityContext (pod and main container:
  mpilaunch's are defaults), the main container's resources (except the GPU
  count: the plan's), dnsConfig (lists appended), and any other field;
- affinity: required node terms are ANDed with mpilaunch's, everything else
  appended;
- schedulerName, priorityClassName and serviceAccountName must agree with
  what --gang, --priority-class and --service-account set; the launcher (and
  the reaper, which follows it) takes a serviceAccountName only from its own
  document, not from the one for every role (that one is the workers': a
  warning says so);
- refused unless equal to mpilaunch's: the pod's name, generateName and
  namespace, restartPolicy, hostname, subdomain, the main container's
  command, args and image, and the agent's port (7355, mpilaunch-agent).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import UsageError
from .launch import AGENT_PORT
from .pod_template import MAIN_CONTAINER, PodTemplates, copied

AGENT_PORT_NAME = "mpilaunch-agent"
RESERVED_PREFIX = "mpilaunch/"
OWNED_POD_FIELDS = {
    "restartPolicy": "mpilaunch decides restarts itself (--retries)",
    "hostname": "the hostfile names each pod by its hostname",
    "subdomain": "the hostfile names each pod by its hostname under the job's Service",
}
OWNED_METADATA = {
    "name": "mpilaunch names the pods after the job (--name)",
    "generateName": "mpilaunch names the pods after the job (--name)",
    "namespace": "give --namespace instead",
}
OWNED_CONTAINER_FIELDS = {
    "command": "the program to run goes after `--` on mpilaunch's command line",
    "args": "the program to run goes after `--` on mpilaunch's command line",
    "image": "give --image instead",
}
# Set by mpilaunch from a flag: the template may repeat the value, not contradict it.
FLAG_POD_FIELDS = {
    "schedulerName": "--gang",
    "priorityClassName": "--priority-class",
    "serviceAccountName": "--service-account",
}
APPENDED_POD_LISTS = (
    "tolerations",
    "imagePullSecrets",
    "topologySpreadConstraints",
    "hostAliases",
    "readinessGates",
    "schedulingGates",
    "resourceClaims",
)


@dataclass(frozen=True)
class _Where:
    source: str
    role: str

    def refuse(self, what: str, hint: str) -> UsageError:
        return UsageError(f"--pod-template {self.source}: {what} in the {self.role} pod is mpilaunch's", hint)

    def clash(self, what: str, hint: str) -> UsageError:
        return UsageError(f"--pod-template {self.source}: {what} in the {self.role} pod clashes with mpilaunch's", hint)


def apply(manifest: dict, role: str, templates: PodTemplates | None) -> dict:
    """``manifest`` (a worker Pod, or the launcher's batch/v1 Job) with the role's template merged into
    its pod; a new dict, neither argument changed.

    It copies ``manifest`` once and hands the merges below that copy: they build on mpilaunch's side
    without copying it again and copy only what they take from the template, so that no object
    appears twice in the result (YAML would print an alias)."""
    out = copied(manifest)
    template = templates.for_role(role) if templates is not None else None
    if template is None:
        return out
    pod = out["spec"]["template"] if out.get("kind") == "Job" else out
    where = _Where(templates.source, role)
    pod["metadata"] = merged_metadata(pod.get("metadata") or {}, template.get("metadata") or {}, where)
    pod["spec"] = merged_pod_spec(pod.get("spec") or {}, template.get("spec") or {}, where)
    return out


def must_agree(ours: dict, theirs: dict, key: str, what: str, hint: str, where: _Where) -> None:
    """A field mpilaunch owns: the template may repeat mpilaunch's value (a copied pod), not change it."""
    if key in theirs and theirs[key] != ours.get(key):
        raise where.refuse(what, hint)


def merged_metadata(ours: dict, theirs: dict, where: _Where) -> dict:
    for key, hint in OWNED_METADATA.items():
        must_agree(ours, theirs, key, f"metadata.{key}", hint, where)
    if theirs.get("ownerReferences"):
        raise where.refuse("metadata.ownerReferences", "every object of a job is owned by its root ConfigMap")
    out = with_new_keys(ours, theirs)
    for key in ("labels", "annotations"):
        if theirs.get(key):
            out[key] = merged_map(ours.get(key) or {}, theirs[key], f"metadata.{key}", where, reserved=True)
    return out


def merged_map(ours: dict, theirs: dict, what: str, where: _Where, reserved: bool = False) -> dict:
    """Keys merged; one that mpilaunch set to another value, or one under ``mpilaunch/``, is refused."""
    for key, value in theirs.items():
        if key in ours and str(ours[key]) != str(value):
            raise where.clash(
                f"{what} {key}={value}",
                f"mpilaunch sets {key}={ours[key]} (from its flags: --node-selector, --gang, --queue, "
                f"--mesh-injection); drop it from the template or change the flag",
            )
        if reserved and key not in ours and str(key).startswith(RESERVED_PREFIX):
            raise where.refuse(f"{what} {key}", f"the {RESERVED_PREFIX} prefix is mpilaunch's; use another key")
    return with_new_keys(ours, theirs)


def with_new_keys(ours: dict, theirs: dict) -> dict:
    """``ours`` (first, as rendered) plus the keys only ``theirs`` has."""
    out = dict(ours)
    for key, value in theirs.items():
        out.setdefault(key, copied(value))
    return out


def merged_over(ours: dict, theirs: dict, append_lists: bool = False) -> dict:
    """The template's values over mpilaunch's defaults, maps merged; lists replaced, or appended."""
    out = dict(ours)
    for key, value in theirs.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = merged_over(old, value, append_lists)
        elif append_lists and isinstance(old, list) and isinstance(value, list):
            out[key] = appended(old, value)
        else:
            out[key] = copied(value)
    return out


def appended(ours: list, theirs: list) -> list:
    """``theirs`` after ``ours``, leaving out what ``ours`` already holds (a template that repeats a flag)."""
    return list(ours) + [copied(item) for item in theirs if item not in ours]


def merged_pod_spec(ours: dict, theirs: dict, where: _Where) -> dict:
    out = dict(ours)
    for key, value in theirs.items():
        if key in OWNED_POD_FIELDS:
            must_agree(ours, theirs, key, f"spec.{key}", OWNED_POD_FIELDS[key], where)
        elif key in FLAG_POD_FIELDS:
            if ours.get(key) not in (None, value):
                raise where.clash(
                    f"spec.{key} {value!r}",
                    f"mpilaunch sets {ours[key]!r} from {FLAG_POD_FIELDS[key]}: give the template's "
                    f"value there, or drop it from the template",
                )
            out[key] = value
        elif key == "containers":
            out[key] = merged_containers(ours.get(key) or [], value or [], where)
        elif key == "volumes":
            out[key] = appended_named(ours.get(key) or [], value or [], f"spec.{key}", where)
        elif key == "initContainers":
            check_new_names(ours.get(key) or [], value or [], f"spec.{key}", where)
            out[key] = list(ours.get(key) or []) + with_container_security(value or [], ours)
        elif key == "nodeSelector":
            out[key] = merged_map(ours.get(key) or {}, value or {}, f"spec.{key}", where)
        elif key == "securityContext":
            out[key] = merged_over(ours.get(key) or {}, value or {})
        elif key == "dnsConfig":
            out[key] = merged_over(ours.get(key) or {}, value or {}, append_lists=True)
        elif key == "affinity":
            out[key] = merged_affinity(ours.get(key) or {}, value or {})
        elif key in APPENDED_POD_LISTS:
            out[key] = appended(ours.get(key) or [], value or [])
        else:  # e.g. runtimeClassName, automountServiceAccountToken, terminationGracePeriodSeconds
            out[key] = copied(value)
    return out


def check_new_names(ours: list, theirs: list, what: str, where: _Where) -> None:
    names = {item.get("name") for item in ours}
    for item in theirs:
        if item.get("name") in names:
            raise where.clash(f"{what} {item.get('name')!r}", "mpilaunch uses that name; rename the template's")


def appended_named(ours: list, theirs: list, what: str, where: _Where) -> list:
    check_new_names(ours, theirs, what, where)
    return list(ours) + copied(theirs)


def merged_affinity(ours: dict, theirs: dict) -> dict:
    """Both sets of constraints hold: required node terms are ORed within one affinity, so the two
    are combined term by term (AND); every other affinity list is ANDed or weighted, so appended."""
    out = merged_over(ours, theirs, append_lists=True)
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    ours_terms = (((ours.get("nodeAffinity") or {}).get(required)) or {}).get("nodeSelectorTerms")
    theirs_terms = (((theirs.get("nodeAffinity") or {}).get(required)) or {}).get("nodeSelectorTerms")
    if ours_terms and theirs_terms:
        out["nodeAffinity"][required]["nodeSelectorTerms"] = [
            {
                part: copied(a.get(part) or []) + copied(b.get(part) or [])
                for part in ("matchExpressions", "matchFields")
                if a.get(part) or b.get(part)
            }
            for a in ours_terms
            for b in theirs_terms
        ]
    return out


def with_container_security(containers: list, ours_pod: dict) -> list:
    """The template's own containers get mpilaunch's container securityContext under theirs, so that a
    namespace enforcing PodSecurity "restricted" admits a sidecar written without one."""
    main = next(iter(ours_pod.get("containers") or []), {})
    defaults = main.get("securityContext") or {}
    return [
        {**copied(c), "securityContext": merged_over(copied(defaults), c.get("securityContext") or {})}
        if defaults
        else copied(c)
        for c in containers
    ]


def merged_containers(ours: list, theirs: list, where: _Where) -> list:
    """The main container merged (it stays first: the launcher's relaunch patches containers[0]); the
    template's other containers appended as sidecars."""
    main_name = MAIN_CONTAINER[where.role]
    theirs_main = next((c for c in theirs if c.get("name") == main_name), None)
    out = [
        merged_main_container(c, theirs_main, where) if c.get("name") == main_name and theirs_main else c for c in ours
    ]
    sidecars = [c for c in theirs if c.get("name") != main_name]
    check_new_names(ours, sidecars, "spec.containers", where)
    return out + with_container_security(sidecars, {"containers": ours})


def merged_main_container(ours: dict, theirs: dict, where: _Where) -> dict:
    what = f"the {ours['name']} container's"
    # a template of one sidecar alone makes that sidecar the main container: say how to tell them apart
    which = f"; the template's container named {ours['name']}, else its first, is mpilaunch's (a sidecar goes after it)"
    for key, hint in OWNED_CONTAINER_FIELDS.items():
        must_agree(ours, theirs, key, f"{what} {key}", hint + which, where)
    out = dict(ours)
    for key, value in theirs.items():
        if key in OWNED_CONTAINER_FIELDS or key == "name":
            continue
        if key == "ports":
            for port in value or []:
                if port.get("containerPort") == AGENT_PORT or port.get("name") == AGENT_PORT_NAME:
                    raise where.refuse(
                        f"{what} port {port.get('name') or port.get('containerPort')}",
                        f"mpilaunch's agent listens on {AGENT_PORT} ({AGENT_PORT_NAME}); use another port",
                    )
            out[key] = appended(ours.get(key) or [], value or [])
        elif key == "env":
            out[key] = appended_named(ours.get(key) or [], value or [], f"{what} env", where)
        elif key == "volumeMounts":
            taken = {m.get("mountPath") for m in ours.get(key) or []}
            for mount in value or []:
                if mount.get("mountPath") in taken:
                    raise where.clash(
                        f"{what} volumeMount at {mount.get('mountPath')}",
                        "mpilaunch mounts its own volume there; mount the template's elsewhere",
                    )
            out[key] = appended(ours.get(key) or [], value or [])
        elif key == "envFrom":
            out[key] = appended(ours.get(key) or [], value or [])
        elif key == "securityContext":
            out[key] = merged_over(ours.get(key) or {}, value or {})
        elif key == "resources":
            out[key] = merged_resources(ours.get(key) or {}, value or {}, what, where)
        else:  # e.g. imagePullPolicy, workingDir, probes, lifecycle
            out[key] = copied(value)
    return out


def merged_resources(ours: dict, theirs: dict, what: str, where: _Where) -> dict:
    """The template's requests and limits win, but for the GPUs (the plan's, from --gpus and
    --gpus-per-node); where mpilaunch set request = limit (resources.py: a LimitRange's ratio, the
    Guaranteed class), a template that sets one of the two sets both."""
    out = merged_over(ours, theirs)
    for part, other in (("requests", "limits"), ("limits", "requests")):
        ours_part = ours.get(part) or {}
        for name, value in (theirs.get(part) or {}).items():
            if "/" in name and name in ours_part and str(ours_part[name]) != str(value):
                raise where.clash(
                    f"{what} resources.{part} {name}: {value}",
                    f"mpilaunch asks for {ours_part[name]} per worker: size the job with --gpus and "
                    f"--gpus-per-node (--gpu-resource names the resource)",
                )
            paired = name in ours_part and (ours.get(other) or {}).get(name) == ours_part[name]
            if paired and name not in (theirs.get(other) or {}):
                out[other] = {**out[other], name: value}
    return out
