"""--pod-template: the file's forms, each merge rule, each field mpilaunch owns, --gpu-resource.

The rendered pods here have the shape of k8s-worker.yaml.j2 and
k8s-launcher.yaml.j2 (a Pod; a batch/v1 Job whose pod is .spec.template).
"""

from __future__ import annotations

import copy

import pytest

from mpilaunch.backends.k8s import pod_template
from mpilaunch.backends.k8s.pod_merge import apply
from mpilaunch.backends.k8s.pod_template import check_gpu_resource, load, parse
from mpilaunch.core.errors import UsageError
from mpilaunch.core.exit_codes import EXIT_USAGE

pytest.importorskip("yaml")

CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def worker_pod() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "j-worker-0",
            "namespace": "ns",
            "labels": {"mpilaunch/job": "j", "mpilaunch/role": "worker"},
            "annotations": {"sidecar.istio.io/inject": "false"},
        },
        "spec": {
            "hostname": "j-worker-0",
            "subdomain": "j",
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {
                "seccompProfile": {"type": "RuntimeDefault"},
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
            },
            "dnsConfig": {"searches": ["j.ns.svc.cluster.local"]},
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "img",
                    "command": ["/bin/sh", "-c", "exec agent"],
                    "securityContext": CONTAINER_SECURITY,
                    "ports": [{"name": "mpilaunch-agent", "containerPort": 7355, "protocol": "TCP"}],
                    "env": [{"name": "MPILAUNCH_JOB", "value": "j"}, {"name": "HOME", "value": "/tmp"}],
                    "resources": {
                        "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 8},
                        "requests": {"cpu": "4", "memory": "8Gi"},
                    },
                    "volumeMounts": [
                        {"name": "dshm", "mountPath": "/dev/shm"},
                        {"name": "scratch", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "scratch", "emptyDir": {}}],
        },
    }


def launcher_job() -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j-launcher", "namespace": "ns", "labels": {"mpilaunch/job": "j"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"mpilaunch/job": "j", "mpilaunch/role": "launcher"}},
                "spec": {
                    "hostname": "j-launcher",
                    "subdomain": "j",
                    "restartPolicy": "Never",
                    "serviceAccountName": "j-launcher",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                    "containers": [
                        {
                            "name": "launcher",
                            "image": "img",
                            "command": ["launch"],
                            "securityContext": CONTAINER_SECURITY,
                            "resources": {
                                "requests": {"cpu": "1", "memory": "512Mi"},
                                "limits": {"cpu": "1", "memory": "512Mi"},
                            },
                            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                },
            },
        },
    }


def templates(*documents, source="tpl.yaml"):
    return parse(list(documents), source)


def pod(spec=None, metadata=None, **top):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata or {}, "spec": spec or {}, **top}


def main_container(manifest: dict) -> dict:
    spec = manifest["spec"]["template"]["spec"] if manifest["kind"] == "Job" else manifest["spec"]
    return spec["containers"][0]


# ------------------------------------------------------------------ the file's forms


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: Pod\nmetadata: {labels: {team: ml}}\nspec: {priorityClassName: high}\n",
        "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: t}\n"
        "template: {metadata: {labels: {team: ml}}, spec: {priorityClassName: high}}\n",
        "metadata: {labels: {team: ml}}\nspec: {priorityClassName: high}\n",
    ],
    ids=["Pod", "PodTemplate", "PodTemplateSpec"],
)
def test_pod_template_file_may_be_a_pod_a_pod_template_or_a_bare_spec(tmp_path, text):
    path = tmp_path / "tpl.yaml"
    path.write_text(text)
    loaded = load(str(path))
    for role, manifest in (("worker", worker_pod()), ("launcher", launcher_job())):
        pod_ = apply(manifest, role, loaded)
        pod_ = pod_["spec"]["template"] if role == "launcher" else pod_
        assert pod_["metadata"]["labels"]["team"] == "ml"
        assert pod_["spec"]["priorityClassName"] == "high"


def test_pod_template_role_documents_and_a_role_document_over_the_all_roles_one(tmp_path):
    path = tmp_path / "tpl.yaml"
    path.write_text("""
kind: Pod
spec:
  tolerations: [{key: shared, operator: Exists}]
  containers:
  - name: main
    env: [{name: LEVEL, value: all}, {name: COMMON, value: "1"}]
---
kind: PodTemplate
metadata: {labels: {mpilaunch/role: launcher}}
template:
  spec:
    nodeSelector: {pool: cpu}
---
kind: Pod
metadata: {labels: {mpilaunch/role: worker}}
spec:
  tolerations: [{key: gpu-only, operator: Exists}]
  containers:
  - name: worker
    env: [{name: LEVEL, value: worker}]
""")
    loaded = load(str(path))
    worker = apply(worker_pod(), "worker", loaded)
    env = main_container(worker)["env"]
    # the role's env var replaces the all-roles one of that name; the rest of the all-roles doc stays
    assert env[-2:] == [{"name": "LEVEL", "value": "worker"}, {"name": "COMMON", "value": "1"}]
    # a list without a merge key is the role's, as in a strategic-merge patch
    assert worker["spec"]["tolerations"][1:] == [{"key": "gpu-only", "operator": "Exists"}]
    assert worker["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert worker["metadata"]["labels"]["mpilaunch/role"] == "worker"  # the selecting label is not carried over
    launcher = apply(launcher_job(), "launcher", loaded)["spec"]["template"]
    assert launcher["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert launcher["spec"]["tolerations"] == [{"key": "shared", "operator": "Exists"}]
    assert [e["name"] for e in launcher["spec"]["containers"][0]["env"]] == ["LEVEL", "COMMON"]


def test_pod_template_with_only_a_worker_document_leaves_the_launcher_alone():
    loaded = templates(pod({"priorityClassName": "high"}, {"labels": {"mpilaunch/role": "worker"}}))
    assert apply(launcher_job(), "launcher", loaded) == launcher_job()
    assert apply(worker_pod(), "worker", loaded)["spec"]["priorityClassName"] == "high"
    assert apply(worker_pod(), "worker", None) == worker_pod()


@pytest.mark.parametrize(
    "text, said",
    [
        ("kind: Pod\nspec: [unclosed\n", "is not valid YAML at line"),
        ("apiVersion: batch/v1\nkind: Job\nspec: {}\n", "document 1 is a Job, not a Pod or PodTemplate"),
        ("containers: []\n", "document 1 has no kind and is not a pod template spec"),
        ("- a list\n", "document 1 is a list, not a mapping"),
        ("kind: Pod\nmetadata: {labels: {mpilaunch/role: chief}}\n", "unknown role 'chief'"),
        ("kind: Pod\nspec: {}\n---\nkind: Pod\nspec: {}\n", "two documents for every role (document 2)"),
        ("kind: Pod\nspec: {containers: {name: x}}\n", "spec.containers that is not a list of mappings"),
        ("---\n", "holds no pod template"),
        ("kind: Pod\nmetadata: {labels: [a]}\n", "metadata.labels that is not a mapping"),
        (
            "kind: PodTemplate\nmetadata: {labels: {mpilaunch/role: worker}}\n"
            "template: {metadata: {labels: {mpilaunch/role: launcher}}}\n",
            "labelled mpilaunch/role: worker",
        ),
    ],
)
def test_pod_template_a_file_that_cannot_be_used_is_one_usage_line_naming_it(tmp_path, text, said):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        load(str(path))
    assert e.value.exit_code == EXIT_USAGE
    assert said in e.value.message and str(path) in e.value.message, e.value.message
    assert "\n" not in e.value.message and e.value.hint


def test_pod_template_an_unreadable_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"cannot read --pod-template .*missing.yaml"):
        load(str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------------ merge rules


def test_pod_template_labels_and_annotations_merge_and_mpilaunchs_own_are_kept():
    loaded = templates(
        pod(metadata={"labels": {"team": "ml", "mpilaunch/job": "j"}, "annotations": {"prometheus.io/scrape": "true"}})
    )
    merged = apply(worker_pod(), "worker", loaded)["metadata"]
    assert merged["labels"] == {"mpilaunch/job": "j", "mpilaunch/role": "worker", "team": "ml"}
    assert merged["annotations"] == {"sidecar.istio.io/inject": "false", "prometheus.io/scrape": "true"}
    assert merged["name"] == "j-worker-0"


@pytest.mark.parametrize(
    "metadata, said",
    [
        ({"labels": {"mpilaunch/job": "other"}}, "metadata.labels mpilaunch/job=other in the worker pod clashes"),
        ({"labels": {"mpilaunch/extra": "x"}}, "metadata.labels mpilaunch/extra in the worker pod is mpilaunch's"),
        ({"annotations": {"sidecar.istio.io/inject": "true"}}, "metadata.annotations sidecar.istio.io/inject=true"),
    ],
)
def test_pod_template_a_label_or_annotation_against_mpilaunchs_is_refused(metadata, said):
    with pytest.raises(UsageError) as e:
        apply(worker_pod(), "worker", templates(pod(metadata=metadata)))
    assert said in e.value.message


def test_pod_template_pull_secrets_tolerations_volumes_mounts_env_and_sidecars_are_appended():
    loaded = templates(
        pod(
            {
                "imagePullSecrets": [{"name": "regcred"}],
                "tolerations": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
                "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
                "containers": [
                    {
                        "name": "worker",
                        "env": [
                            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "k"}}}
                        ],
                        "envFrom": [{"secretRef": {"name": "wandb"}}],
                        "ports": [{"name": "metrics", "containerPort": 9090}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                    },
                    {"name": "logs", "image": "fluent-bit", "securityContext": {"runAsUser": 3000}},
                ],
            }
        )
    )
    spec = apply(worker_pod(), "worker", loaded)["spec"]
    ours = worker_pod()["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["tolerations"] == ours["tolerations"] + [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    assert [v["name"] for v in spec["volumes"]] == ["dshm", "scratch", "data"]
    main = spec["containers"][0]
    assert main["env"][-1]["valueFrom"] == {"secretKeyRef": {"name": "s3", "key": "k"}}
    assert main["env"][:2] == ours["containers"][0]["env"]
    assert main["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert [p["containerPort"] for p in main["ports"]] == [7355, 9090]
    assert main["volumeMounts"][-1] == {"name": "data", "mountPath": "/data", "readOnly": True}
    # sidecars and init containers come after the main one, with mpilaunch's securityContext under
    # their own: a "restricted" namespace admits them
    assert [c["name"] for c in spec["containers"]] == ["worker", "logs"]
    assert spec["containers"][1]["securityContext"] == {**CONTAINER_SECURITY, "runAsUser": 3000}
    assert spec["initContainers"][0]["securityContext"] == CONTAINER_SECURITY


def test_pod_template_security_context_and_the_main_containers_resources_are_the_templates():
    loaded = templates(
        pod(
            {
                "securityContext": {"runAsUser": 2000, "fsGroup": 2000},
                "containers": [
                    {
                        "name": "worker",
                        "securityContext": {"readOnlyRootFilesystem": True},
                        "resources": {"limits": {"memory": "64Gi"}, "requests": {"ephemeral-storage": "10Gi"}},
                    }
                ],
            }
        )
    )
    spec = apply(worker_pod(), "worker", loaded)["spec"]
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 1000,
        "fsGroup": 2000,
    }
    main = spec["containers"][0]
    assert main["securityContext"] == {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True}
    # request = limit where mpilaunch paired them (a LimitRange's ratio): the template's limit moves both
    assert main["resources"] == {
        "limits": {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": 8},
        "requests": {"cpu": "4", "memory": "64Gi", "ephemeral-storage": "10Gi"},
    }


def test_pod_template_gpu_count_is_the_plans():
    loaded = templates(pod({"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}))
    with pytest.raises(UsageError, match="resources.limits nvidia.com/gpu: 1 in the worker pod clashes"):
        apply(worker_pod(), "worker", loaded)
    same = templates(pod({"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}))
    assert main_container(apply(worker_pod(), "worker", same))["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_pod_template_node_selector_merges_and_affinity_adds_to_mpilaunchs():
    loaded = templates(
        pod(
            {
                "nodeSelector": {"zone": "a"},
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                            ]
                        }
                    }
                },
                "dnsConfig": {"searches": ["corp.example"], "options": [{"name": "ndots", "value": "2"}]},
            }
        )
    )
    ours = worker_pod()
    ours["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    spec = apply(ours, "worker", loaded)["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu", "zone": "a"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # (pool=x OR name=n1) AND gpu=a100: each of mpilaunch's terms with the template's expressions
    assert [sorted(e["key"] for e in t.get("matchExpressions", [])) for t in terms] == [["gpu", "pool"], ["gpu"]]
    assert terms[1]["matchFields"][0]["key"] == "metadata.name"
    assert spec["dnsConfig"] == {
        "searches": ["j.ns.svc.cluster.local", "corp.example"],
        "options": [{"name": "ndots", "value": "2"}],
    }
    with pytest.raises(UsageError, match="spec.nodeSelector pool=cpu in the worker pod clashes"):
        apply(worker_pod(), "worker", templates(pod({"nodeSelector": {"pool": "cpu"}})))


def test_pod_template_launcher_job_gets_its_pod_merged_and_its_first_container_is_the_main_one():
    loaded = templates(
        pod(
            {
                "serviceAccountName": "j-launcher",
                "containers": [
                    {"name": "app", "resources": {"limits": {"cpu": "2"}}, "imagePullPolicy": "Always"},
                    {"name": "proxy", "image": "envoy"},
                ],
            }
        )
    )
    job = apply(launcher_job(), "launcher", loaded)
    assert job["spec"]["backoffLimit"] == 0 and job["metadata"] == launcher_job()["metadata"]
    containers = job["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["launcher", "proxy"]  # relaunch patches containers[0]
    assert containers[0]["command"] == ["launch"] and containers[0]["imagePullPolicy"] == "Always"
    assert containers[0]["resources"] == {
        "requests": {"cpu": "2", "memory": "512Mi"},
        "limits": {"cpu": "2", "memory": "512Mi"},
    }


def test_pod_template_scheduler_priority_and_service_account_must_agree_with_the_flags():
    launchers = {"labels": {"mpilaunch/role": "launcher"}}
    with pytest.raises(UsageError, match=r"spec.serviceAccountName 'ml-runner' in the launcher pod clashes"):
        apply(launcher_job(), "launcher", templates(pod({"serviceAccountName": "ml-runner"}, launchers)))
    # the document for every role's account is the workers' alone (issue 49, item 10)
    shared = templates(pod({"serviceAccountName": "s3-reader"}))
    assert pod_template.launcher_service_account(shared, None) is None
    assert apply(launcher_job(), "launcher", shared)["spec"]["template"]["spec"]["serviceAccountName"] == "j-launcher"
    assert "is the workers' only" in pod_template.shared_account_warning(shared, None)
    assert pod_template.shared_account_warning(shared, "s3-reader") is None
    ours = worker_pod()
    ours["spec"]["schedulerName"] = "volcano"
    with pytest.raises(UsageError, match="spec.schedulerName 'default-scheduler' in the worker pod clashes") as e:
        apply(ours, "worker", templates(pod({"schedulerName": "default-scheduler"})))
    assert "mpilaunch sets 'volcano' from --gang" in e.value.hint
    # the template's account is the launcher's when --service-account is not given (Spark's way)
    loaded = templates(pod({"serviceAccountName": "ml-runner"}, {"labels": {"mpilaunch/role": "launcher"}}))
    assert pod_template.launcher_service_account(loaded, None) == "ml-runner"
    assert pod_template.launcher_service_account(loaded, "ml-runner") == "ml-runner"
    assert pod_template.launcher_service_account(None, "sa") == "sa"
    with pytest.raises(UsageError, match="is not --service-account 'other'"):
        pod_template.launcher_service_account(loaded, "other")
    # a worker pod names no account: the template's is taken
    assert apply(worker_pod(), "worker", loaded)["spec"].get("serviceAccountName") is None
    assert (
        apply(worker_pod(), "worker", templates(pod({"serviceAccountName": "s3-reader"})))["spec"]["serviceAccountName"]
        == "s3-reader"
    )


def test_pod_template_result_shares_no_object_so_render_prints_no_yaml_alias():
    import yaml

    secure = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    loaded = templates(
        pod(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                                {"matchExpressions": [{"key": "b", "operator": "Exists"}]},
                            ]
                        }
                    }
                },
                "initContainers": [{"name": "i1"}, {"name": "i2"}],
                "containers": [{"name": "worker", "securityContext": secure}, {"name": "s1"}, {"name": "s2"}],
            }
        )
    )
    ours = worker_pod()
    ours["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "c", "operator": "Exists"}]}]
            }
        }
    }
    text = yaml.safe_dump(apply(ours, "worker", loaded))
    assert "&id" not in text and "*id" not in text


def test_pod_template_apply_changes_neither_argument():
    loaded = templates(
        pod(
            {
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{"name": "worker", "env": [{"name": "A", "value": "1"}]}],
            }
        )
    )
    before = copy.deepcopy(loaded.roles)
    manifest = worker_pod()
    first = apply(manifest, "worker", loaded)
    assert manifest == worker_pod() and loaded.roles == before
    assert apply(manifest, "worker", loaded) == first  # once per worker: the same each time


# ------------------------------------------------------------------ fields mpilaunch owns


@pytest.mark.parametrize(
    "role, template, field",
    [
        (
            "worker",
            pod({"containers": [{"name": "worker", "command": ["python", "train.py"]}]}),
            "the worker container's command",
        ),
        ("worker", pod({"containers": [{"name": "worker", "args": ["--x"]}]}), "the worker container's args"),
        ("launcher", pod({"containers": [{"name": "main", "image": "other"}]}), "the launcher container's image"),
        (
            "worker",
            pod({"containers": [{"name": "worker", "ports": [{"containerPort": 7355}]}]}),
            "the worker container's port 7355",
        ),
        (
            "worker",
            pod({"containers": [{"name": "worker", "ports": [{"name": "mpilaunch-agent", "containerPort": 1}]}]}),
            "the worker container's port mpilaunch-agent",
        ),
        ("worker", pod({"restartPolicy": "OnFailure"}), "spec.restartPolicy"),
        ("launcher", pod({"restartPolicy": "Always"}), "spec.restartPolicy"),
        ("worker", pod({"hostname": "h"}), "spec.hostname"),
        ("launcher", pod({"subdomain": "s"}), "spec.subdomain"),
        ("worker", pod(metadata={"name": "mine"}), "metadata.name"),
        ("launcher", pod(metadata={"namespace": "other"}), "metadata.namespace"),
    ],
)
def test_pod_template_a_field_mpilaunch_owns_is_one_usage_line(role, template, field):
    manifest = worker_pod() if role == "worker" else launcher_job()
    with pytest.raises(UsageError) as e:
        apply(manifest, role, templates(template))
    assert e.value.exit_code == EXIT_USAGE
    assert e.value.message == f"--pod-template tpl.yaml: {field} in the {role} pod is mpilaunch's"
    assert e.value.hint


def test_pod_template_may_repeat_an_owned_value():
    loaded = templates(
        pod({"restartPolicy": "Never", "containers": [{"name": "worker", "image": "img"}]}, {"namespace": "ns"})
    )
    assert apply(worker_pod(), "worker", loaded) == worker_pod()


@pytest.mark.parametrize(
    "template, said",
    [
        (pod({"volumes": [{"name": "scratch", "emptyDir": {}}]}), "spec.volumes 'scratch'"),
        (
            pod({"containers": [{"name": "worker", "env": [{"name": "HOME", "value": "/home/me"}]}]}),
            "the worker container's env 'HOME'",
        ),
        (
            pod({"containers": [{"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/tmp"}]}]}),
            "the worker container's volumeMount at /tmp",
        ),
    ],
)
def test_pod_template_a_name_mpilaunch_uses_is_refused(template, said):
    with pytest.raises(UsageError) as e:
        apply(worker_pod(), "worker", templates(template))
    assert e.value.message == f"--pod-template tpl.yaml: {said} in the worker pod clashes with mpilaunch's"


# ------------------------------------------------------------------ --gpu-resource


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "nvidia.com/mig-1g.10gb"])
def test_pod_template_gpu_resource_names_a_device_plugins_resource(name):
    assert check_gpu_resource(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "nvidia.com/",
        "/gpu",
        "Nvidia.com/gpu",
        "nvidia.com/gpu/x",
        "a b/gpu",
        "kubernetes.io/gpu",
        "requests.nvidia.com/gpu",
        "nvidia.com/-gpu",
    ],
)
def test_pod_template_gpu_resource_refuses_what_no_device_plugin_offers(name):
    with pytest.raises(UsageError) as e:
        check_gpu_resource(name)
    assert e.value.exit_code == EXIT_USAGE and "--gpu-resource" in e.value.message
    assert "nvidia.com/gpu" in e.value.hint


def test_pod_template_reaper_takes_only_the_pull_secrets_of_a_document_for_every_role():
    """The reaper runs the job's image (a private registry's secret is needed) but not the workers'
    dataset volume or GPU placement; a document labelled reaper is its own."""
    templates = pod_template.parse(
        [
            {
                "spec": {
                    "imagePullSecrets": [{"name": "regcred"}],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                    "nodeSelector": {"gpu": "yes"},
                }
            },
            {
                "metadata": {"labels": {"mpilaunch/role": "reaper"}},
                "spec": {"priorityClassName": None, "nodeSelector": {"pool": "cpu"}},
            },
        ],
        "t.yaml",
    )
    reaper = templates.for_role("reaper")["spec"]
    assert reaper["imagePullSecrets"] == [{"name": "regcred"}]
    assert "volumes" not in reaper and reaper["nodeSelector"] == {"pool": "cpu"}
