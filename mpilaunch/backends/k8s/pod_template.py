"""--pod-template FILE: a user's pod template merged into the pods mpilaunch renders (pure, but for ``load``).

A shared cluster asks for pod fields no flag covers: imagePullSecrets for a
private registry, affinity, a dataset volume, env from a Secret, a UID. Like
Spark on Kubernetes (``spark.kubernetes.{driver,executor}.podTemplateFile``),
the user writes a pod and mpilaunch lays its own pod over it; unlike Spark,
which silently overwrites what it owns, a field mpilaunch owns is refused
with one line, so a template never seems to work and then does not.

The file: YAML documents, each a ``Pod``, a ``PodTemplate`` (its
``.template``) or a bare PodTemplateSpec (``metadata`` + ``spec``). A
document labelled ``mpilaunch/role: worker`` or ``mpilaunch/role: launcher``
(the label mpilaunch puts on those pods anyway) is for that role; one without
the label is for every role, and a role's own document is laid over it the
way ``kubectl patch`` lays a strategic-merge patch: maps merge, named lists
(containers, volumes, env, ...) merge by name, anything else is the role's.

The main container is the one named like mpilaunch's (``worker``,
``launcher``), else the template's first; the others are sidecars.

How a role's template meets mpilaunch's pod: :mod:`.pod_merge`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from ...core.errors import UsageError
from .pods import LAUNCHER_CONTAINER, ROLE_LABEL, WORKER_CONTAINER

ROLES = ("worker", "launcher", "reaper")
MAIN_CONTAINER = {"worker": WORKER_CONTAINER, "launcher": LAUNCHER_CONTAINER, "reaper": "reaper"}
# The reaper is mpilaunch's own small pod: a document for every role (a dataset volume, a GPU node's
# affinity) is not for it, but it runs the job's image, so the image's pull secrets are.
REAPER_FROM_EVERY_ROLE = ("imagePullSecrets",)
FORMAT_HINT = (
    "a Pod, a PodTemplate or a pod template spec (metadata + spec); a document labelled "
    "mpilaunch/role: worker, launcher or reaper is for that role, one without the label for every role "
    "(the reaper takes only its imagePullSecrets)"
)

# What the API server writes into an object: harmless in a template saved with `kubectl get -o yaml`.
SERVER_SET_METADATA = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "generation")

# Laying a role's document over the all-roles one: list items that replace each other by this key.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


@dataclass(frozen=True)
class PodTemplates:
    """The templates of one file, resolved per role (the all-roles document laid under the role's)."""

    source: str
    roles: Mapping[str, dict] = field(default_factory=dict)  # role -> PodTemplateSpec {metadata, spec}
    # the document for every role's serviceAccountName: the workers' only (shared_account_warning)
    shared_account: str | None = None

    def for_role(self, role: str) -> dict | None:
        if role not in ROLES:
            raise ValueError(f"no pod template role {role!r}")
        return self.roles.get(role)


def copied(value):
    """A copy of a YAML/JSON tree (dicts, lists, scalars): copy.deepcopy's memo and dispatch made
    apply cost 1 ms a worker pod, 8 s at 8192 workers; with this and one copy a pod, 0.2 ms."""
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copied(item) for item in value]
    return value


# ------------------------------------------------------------------ reading the file


def load(path: str) -> PodTemplates:
    """Read --pod-template FILE: UsageError (exit 2) for a file that cannot be read or used."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            documents = list(yaml.safe_load_all(f))
    except OSError as e:
        raise UsageError(
            f"cannot read --pod-template {path}: {e.strerror or e}", "give a readable YAML file: " + FORMAT_HINT
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise UsageError(
            f"--pod-template {path} is not valid YAML{where}: {problem}",
            "check the file with: kubectl create --dry-run=client -o yaml -f FILE",
        ) from None
    return parse(documents, path)


def parse(documents: list, source: str) -> PodTemplates:
    """The YAML documents of ``source`` as per-role templates."""
    for_all, for_role = None, {}
    for number, document in enumerate(documents, 1):
        if document is None:  # an empty document, e.g. after a trailing ---
            continue
        template = pod_template_spec(document, source, number)
        role = take_role(template, source, number)
        if (for_all if role is None else for_role.get(role)) is not None:
            whom = "every role" if role is None else f"role {role}"
            raise UsageError(
                f"--pod-template {source}: two documents for {whom} (document {number})",
                "merge them into one: " + FORMAT_HINT,
            )
        if role is None:
            for_all = template
        else:
            for_role[role] = template
    if for_all is None and not for_role:
        raise UsageError(f"--pod-template {source} holds no pod template", "write " + FORMAT_HINT)
    roles = {}
    for role in ROLES:
        shared = for_all if role != "reaper" or for_all is None else reaper_part(for_all)
        if shared is not None and role == "launcher":
            shared = without_account(shared)
        layers = [normalized(t, role) for t in (shared, for_role.get(role)) if t is not None]
        if layers:
            roles[role] = layers[0] if len(layers) == 1 else overlay(*layers)
    shared_account = ((for_all or {}).get("spec") or {}).get("serviceAccountName")
    return PodTemplates(source, roles, shared_account)


def without_account(template: dict) -> dict:
    """The document for every role as the launcher takes it: without a serviceAccountName. The
    launcher's identity (and the reaper's, which follows it) may read and delete the job's pods;
    an account meant for the workers (a bucket reader) is not to become it unnoticed, nor to
    take away the per-job identities (and with them the reaper's rights)."""
    if "serviceAccountName" not in (template.get("spec") or {}):
        return template
    spec = {k: v for k, v in template["spec"].items() if k != "serviceAccountName"}
    return {**template, "spec": spec}


def reaper_part(template: dict) -> dict | None:
    """What of a document for every role the reaper takes (REAPER_FROM_EVERY_ROLE)."""
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k in REAPER_FROM_EVERY_ROLE}
    return {"metadata": {}, "spec": spec} if spec else None


def pod_template_spec(document, source: str, number: int) -> dict:
    """A document as ``{metadata, spec}``; a PodTemplate's own labels go with its pod's (the role)."""

    def bad(what: str) -> UsageError:
        return UsageError(f"--pod-template {source}: document {number} {what}", "write " + FORMAT_HINT)

    if not isinstance(document, dict):
        raise bad(f"is a {type(document).__name__}, not a mapping")
    kind = document.get("kind")
    if kind == "Pod":
        template = {"metadata": document.get("metadata") or {}, "spec": document.get("spec") or {}}
    elif kind == "PodTemplate":
        template = document.get("template") or {}
        if not isinstance(template, dict):
            raise bad("has a .template that is not a mapping")
        outer_role = ((document.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
        if outer_role is not None:
            template = copied(template)
            template["metadata"] = metadata = template.get("metadata") or {}
            metadata["labels"] = labels = metadata.get("labels") or {}
            if labels.setdefault(ROLE_LABEL, outer_role) != outer_role:
                raise bad(f"is labelled {ROLE_LABEL}: {outer_role}, and its pod {labels[ROLE_LABEL]}")
    elif kind is None and document and set(document) <= {"metadata", "spec"}:
        template = document
    elif kind is None:
        raise bad(f"has no kind and is not a pod template spec (it has {', '.join(sorted(map(str, document)))})")
    else:
        raise bad(f"is a {kind}, not a Pod or PodTemplate")
    metadata, spec = template.get("metadata") or {}, template.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise bad("has a metadata or spec that is not a mapping")
    for key in ("labels", "annotations"):
        if not isinstance(metadata.get(key) or {}, dict):
            raise bad(f"has a metadata.{key} that is not a mapping")
    for key in ("containers", "initContainers", "volumes"):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise bad(f"has a spec.{key} that is not a list of mappings")
    metadata = {k: v for k, v in metadata.items() if k not in SERVER_SET_METADATA}
    return copied({"metadata": metadata, "spec": spec})


def take_role(template: dict, source: str, number: int) -> str | None:
    """The document's role label, taken off it (it selects; mpilaunch sets the label itself)."""
    labels = template["metadata"].get("labels") or {}
    role = labels.pop(ROLE_LABEL, None)
    if role is not None and role not in ROLES:
        raise UsageError(
            f"--pod-template {source}: document {number} is for an unknown role {role!r} (label {ROLE_LABEL})",
            f"the roles are {' and '.join(ROLES)}; leave the label out for a document for every role",
        )
    return role


def normalized(template: dict, role: str) -> dict:
    """A copy whose main container (named like mpilaunch's, else the first) has mpilaunch's name and comes first."""
    out = copied(template)
    containers = out["spec"].get("containers") or []
    if containers:
        main = next((i for i, c in enumerate(containers) if c.get("name") == MAIN_CONTAINER[role]), 0)
        first = containers.pop(main)
        first["name"] = MAIN_CONTAINER[role]
        out["spec"]["containers"] = [first, *containers]
    return out


def overlay(base: dict, over: dict) -> dict:
    """``over`` laid on ``base`` as a strategic-merge patch: maps merge, named lists merge by their key
    (a container merges; a volume, env var, mount or port is replaced), anything else is ``over``'s."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = overlay(old, value)
        elif key in MERGE_KEYS and isinstance(old, list) and isinstance(value, list):
            out[key] = merged_by_key(old, value, MERGE_KEYS[key], merge_items=key in ("containers", "initContainers"))
        else:
            out[key] = copied(value)
    return out


def merged_by_key(base: list, over: list, key: str, merge_items: bool) -> list:
    out = copied(base)
    at = {item.get(key): i for i, item in enumerate(out) if isinstance(item, dict) and item.get(key) is not None}
    for item in over:
        i = at.get(item.get(key)) if isinstance(item, dict) else None
        if i is None:
            out.append(copied(item))
        else:
            out[i] = overlay(out[i], item) if merge_items else copied(item)
    return out


def launcher_service_account(templates: PodTemplates | None, flag: str | None) -> str | None:
    """--service-account, else the serviceAccountName of the launcher's own document (Spark's way of
    naming an admin-made account; never the document for every role's); the two must agree."""
    spec = ((templates.for_role("launcher") if templates else None) or {}).get("spec") or {}
    named = spec.get("serviceAccountName")
    if named and flag and named != flag:
        raise UsageError(
            f"--pod-template {templates.source}: the launcher's serviceAccountName {named!r} is not "
            f"--service-account {flag!r}",
            "give one of them",
        )
    return flag or named


def shared_account_warning(templates: PodTemplates | None, account: str | None) -> str | None:
    """The one line that says the document for every role names a serviceAccountName the launcher
    and the reaper do not take (``account``: theirs, None for the per-job identities)."""
    shared = templates.shared_account if templates is not None else None
    if not shared or shared == account:
        return None
    theirs = f"run as {account!r}" if account else "keep their per-job identities"
    return (
        f"mpilaunch: warning: --pod-template {templates.source}: serviceAccountName {shared!r} in the document "
        f"for every role is the workers' only; the launcher and reaper {theirs} (to give them one, label a "
        f"document mpilaunch/role: launcher, or pass --service-account)"
    )


# ------------------------------------------------------------------ --gpu-resource

# An extended resource: DOMAIN/NAME, DOMAIN a DNS-1123 subdomain outside kubernetes.io, NAME a
# qualified name (what `kubectl describe node` lists under Capacity, from the device plugin).
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
RESOURCE_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
GPU_RESOURCE_HINT = (
    "an extended resource DOMAIN/NAME as `kubectl describe node` lists it, e.g. --gpu-resource "
    "nvidia.com/gpu, amd.com/gpu or gpu.intel.com/i915"
)


def check_gpu_resource(name: str) -> str:
    """``name`` if it can be a device plugin's resource, else UsageError (exit 2)."""
    domain, slash, resource = name.partition("/")
    valid = (
        slash
        and len(domain) <= 253
        and all(DNS_LABEL_RE.fullmatch(p) for p in domain.split("."))
        and RESOURCE_NAME_RE.fullmatch(resource) is not None
    )
    if not valid:
        raise UsageError(f"invalid --gpu-resource {name!r}", GPU_RESOURCE_HINT)
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain.startswith("requests."):
        raise UsageError(f"--gpu-resource {name!r} is a Kubernetes name, not a device plugin's", GPU_RESOURCE_HINT)
    return name
