"""A Kubernetes job's objects: the templates' values, the rendered manifests in creation order.

Groups, in creation order: root (the ConfigMap that owns the rest), tools,
lease, reaper-rbac, reaper, setup (RBAC, Secrets, Service, PodGroup),
workers, launcher. ``reveal`` puts the Secrets' values themselves in (to
create them); otherwise they are masked (``render``, ``--dry-run``).
"""

from __future__ import annotations

import json
from itertools import groupby

from ...core import hostfile, mpi
from . import admission, launch, network_policy, orphan, pod_merge, resources, security, tools
from .launch import AGENT_PORT, AGENT_SECRET_DIR, AGENT_SECRET_KEY, CLUSTER_DOMAIN, SECRET_DIR, parse_toleration
from .pods import JOB_LABEL, ROLE_LABEL, WORKER_CONTAINER

# the groups whose objects are pods of a role: --pod-template is merged into them (pod_merge.py)
TEMPLATED_GROUPS = {"workers": "worker", "launcher": "launcher", "reaper": "reaper"}


def plan_summary(plan) -> str:
    """The root ConfigMap's plan.json (``mpilaunch status`` reads ranks and gpus): the workers as
    runs of equal ones, so that it stays small at any worker count."""
    runs = [
        {"slots": slots, "gpus": gpus, "count": len(list(same))}
        for (slots, gpus), same in groupby(plan.workers, key=lambda w: (w.slots, w.gpus))
    ]
    return json.dumps(
        {
            "job_name": plan.job_name,
            "ranks": plan.ranks,
            "gpus": plan.gpus,
            "workers": f"{plan.workers[0].name} .. {plan.workers[-1].name}" if plan.workers else "",
            "worker_runs": runs,
        },
        indent=1,
    )


def network_policy_values(backend) -> dict:
    """What ``k8s-network-policy.yaml.j2`` renders from (``network_policy.plan``: which policies)."""
    peers = backend.egress_peers or {}
    return {
        "job": backend.job,
        "namespace": backend.namespace,
        "labels": {JOB_LABEL: backend.job},
        "job_label": JOB_LABEL,
        "role_label": ROLE_LABEL,
        # where the cluster was asked (network_setup.egress_peers; a render does not ask): DNS's own pods,
        # the API server's endpoint ports; else the DNS ports and the usual API ports, to any address
        "api_ports": network_policy.api_ports(backend.api_server(), peers.get("api_endpoints")),
        "dns_rules": network_policy.dns_rules(peers.get("dns_service")),
        "peers_asked": backend.egress_peers is not None,
        "network_policy": network_policy.plan(backend.opts.network_policy, backend.egress_isolated_roles),
    }


def network_policies(backend) -> list[tuple[str, dict]]:
    """The job's NetworkPolicies alone, as :func:`objects` has them (``allocate`` renders them again
    once it knows which of the job's pods the namespace isolates for egress)."""
    import yaml

    if network_policy.plan(backend.opts.network_policy, backend.egress_isolated_roles) is None:
        return []
    text = launch.templates().get_template("k8s-network-policy.yaml.j2").render(network_policy_values(backend))
    return [("setup", obj) for obj in yaml.safe_load_all(text) if obj]


def values(backend, reveal: bool = False) -> dict:
    spec, plan, opts, job = backend.spec, backend.plan, backend.opts, backend.job
    labels = {JOB_LABEL: job}
    gang_labels, gang_annotations = admission.gang_membership(opts.gang, job)
    queue_labels, queue_annotations = admission.queue_membership(opts.queue, job, len(plan.workers))
    worker_labels = {**labels, ROLE_LABEL: "worker", **gang_labels, **queue_labels}
    mesh = security.mesh_annotations(opts.mesh_injection)
    annotations = {**mesh, **gang_annotations, **queue_annotations}
    image = backend.check_image()
    agent = backend.transport == "agent"
    tolerations = [parse_toleration(t) for t in opts.tolerations]
    return {
        **security.template_values(security.parse_run_as(opts.run_as_user), opts.read_only_root, opts.mesh_injection),
        "service_account": opts.service_account,
        "launcher_resources": resources.launcher_resources(len(plan.workers), opts.launcher_cpu, opts.launcher_memory),
        "reaper_resources": resources.reaper_resources(opts.reaper_cpu, opts.reaper_memory),
        "worker_resources": lambda gpus: resources.worker_resources(
            opts.pod_cpu, opts.pod_memory, gpus, opts.gpu_resource
        ),
        # The launcher and reaper use no GPU: the workers' placement (GPU nodes, usually) is not
        # theirs unless asked (--launcher-node-selector, --launcher-toleration).
        "launcher_node_selector": dict(opts.launcher_node_selector or ()),
        "launcher_tolerations": [parse_toleration(t) for t in opts.launcher_tolerations or ()],
        **network_policy_values(backend),
        **orphan.template_values(
            spec, job, {**labels, ROLE_LABEL: "reaper"}, lambda args: tools.reaper_command(backend.tools, args)
        ),
        **tools.template_values(backend.tools, job),
        "worker_command": tools.worker_command(backend.tools, backend.transport),
        "job": job,
        "namespace": backend.namespace,
        "labels": labels,
        "worker_labels": worker_labels,
        # the launcher pod is one of the gang (one scheduler places them all) but holds no resources, so
        # the PodGroup's minMember is the worker count; it is not in Kueue's group (it is a Job's pod)
        "launcher_labels": {**labels, ROLE_LABEL: "launcher", **gang_labels},
        "launcher_annotations": {**mesh, **gang_annotations},
        # A pod's own name resolves only as <pod>.<job>.<ns>.svc.<domain>;
        # hydra proxies connect back to the launcher by its bare hostname
        # (seen on real pods: "unable to get host address for
        # <job>-launcher"), so every pod of the job searches that domain.
        "dns_search": f"{job}.{backend.namespace}.svc.{CLUSTER_DOMAIN}",
        "pod_annotations": annotations,
        "image": image,
        "container": WORKER_CONTAINER,
        "workers": list(plan.workers),
        "worker_names": [w.name for w in plan.workers],
        # the pods the launcher may read and exec into: the workers and every spare it may be told of
        "pod_names": [w.name for w in plan.workers] + backend.launcher_placement.spare_names_for_role(backend),
        "gpu_resource": opts.gpu_resource,
        "pod_memory": opts.pod_memory,
        "pod_cpu": opts.pod_cpu,
        "total_gpus": plan.gpus,
        "node_selector": dict(opts.node_selector),
        "tolerations": tolerations,
        "priority_class": opts.priority_class,
        "gang": opts.gang,
        "scheduler_name": admission.SCHEDULERS.get(opts.gang),
        "schedule_timeout": int(spec.start_timeout),
        "launcher_name": backend.launcher_name,
        "launcher_command": tools.launcher_command(backend.tools, spec.mpirun),
        "hostfile": hostfile.render([(w.name, w.slots) for w in plan.workers], launch.image_mpi_info(spec).flavour),
        "plan_json": plan_summary(plan),
        "launch_json": backend.launcher_placement.launch_json(backend),
        "secret_name": launch.secret_name(job),
        "job_secret_names": launch.job_secret_names(job, backend.transport),
        "secret_dir": SECRET_DIR,
        "secret_json": backend.launcher_placement.secret_json(backend, reveal),
        "detach": spec.detach,
        # the in-cluster launcher posts Events: a detached job's hang verdict, --preflight's findings
        "post_events": spec.detach or spec.preflight != "off",
        # --transport agent: each worker pod's main process is mpilaunch's exec agent (no pods/exec)
        "transport": backend.transport,
        "agent": {
            "port": AGENT_PORT,
            "secret_name": launch.agent_secret_name(job),
            "secret_dir": AGENT_SECRET_DIR,
            "secret_key": AGENT_SECRET_KEY,
            "secret": backend.agent_secret if reveal else mpi.mask(backend.agent_secret),
        }
        if agent
        else None,
    }


def manifests(backend, reveal: bool = False) -> list[tuple[str, str]]:
    """``(group, yaml text)`` in creation order."""
    env = launch.templates()
    vals = values(backend, reveal)
    docs = [("root", env.get_template("k8s-root.yaml.j2").render(vals))]
    if backend.tools:
        docs.append(("tools", env.get_template("k8s-tools.yaml.j2").render(vals)))
    own_identities = not backend.opts.service_account  # else an admin's (rbac.py): no RBAC object here
    docs += [
        (group, env.get_template(name).render(vals))
        for group, name in orphan.templates_for(backend.spec.detach)
        if own_identities or group != "reaper-rbac"
    ]
    if vals["network_policy"] is not None:
        docs.append(("setup", env.get_template("k8s-network-policy.yaml.j2").render(vals)))
    docs += [
        ("setup", env.get_template(name).render(vals))
        for name in backend.launcher_placement.setup_templates(own_identities)
    ]
    if vals["agent"]:
        docs.append(("setup", env.get_template("k8s-agent-secret.yaml.j2").render(vals)))
    docs.append(("setup", env.get_template("k8s-service.yaml.j2").render(vals)))
    if backend.opts.gang != "none":
        docs.append(("setup", env.get_template("k8s-podgroup.yaml.j2").render(vals)))
    worker = env.get_template("k8s-worker.yaml.j2")
    for w in backend.plan.workers:
        docs.append(("workers", worker.render({**vals, "worker": w})))
    docs += [
        ("launcher", env.get_template(name).render(vals)) for name in backend.launcher_placement.launcher_templates()
    ]
    return docs


def objects(backend, reveal: bool = False) -> list[tuple[str, dict]]:
    import yaml

    # libyaml's loader where PyYAML has it: the pure-Python one took 64 ms of every launch for
    # the tools ConfigMap alone (370 KB of base64), libyaml's 1.7 ms
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out = []
    for group, text in manifests(backend, reveal):
        for obj in yaml.load_all(text, Loader=loader):
            if obj:
                out.append((group, templated(backend, group, obj)))
    return out


def templated(backend, group: str, obj: dict) -> dict:
    """``obj`` with --pod-template merged in, where it is a pod of a role (a worker Pod, the launcher Job)."""
    role = TEMPLATED_GROUPS.get(group)
    return pod_merge.apply(obj, role, backend.pod_templates) if role and backend.pod_templates else obj


def render(backend) -> str:
    head = (
        f"# mpilaunch job {backend.job} in namespace {backend.namespace}: objects are created in this order\n"
        f"# (apply with `kubectl create -f` or `kubectl apply --server-side -f`: client-side apply keeps a\n"
        f"# copy of each object in an annotation, and {tools.configmap_name(backend.job)} is larger than "
        f"its 256 KB);\n"
        f"# all but the root ConfigMap get an ownerReference to it at creation (its uid is not known before);\n"
        f"# the Secrets' values are masked here.\n"
    )
    if backend.pod_templates is None:
        return head + "".join(f"---\n{text.strip()}\n" for _, text in manifests(backend))
    # with a pod template the pods are what objects() creates (the templates' comments are lost there)
    import yaml

    head += f"# the pods have --pod-template {backend.pod_templates.source} merged in.\n"
    return head + "".join(f"---\n{yaml.safe_dump(obj, sort_keys=False).strip()}\n" for _, obj in objects(backend))
