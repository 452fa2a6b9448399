"""GPU models and node labels as each dialect writes them: Kubernetes pod templates
(nodeSelector, required node affinity), OpenPAI v2's HiveD skuType, the native fields;
whatever cannot be applied is kept with a warning at its path."""

from __future__ import annotations

from typing import Any

import pytest

from trainyard_common.dialects import field_path, translate
from trainyard_common.jobspec import EnvVar

from ..support.payloads import kubeflow, pod, t9k

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def required(*expressions: dict[str, Any], terms: int = 1) -> dict[str, Any]:
    term = {"matchExpressions": list(expressions)}
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term] * terms}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


GPU = "nvidia.com/gpu.product"
SPEC = "$.spec.pytorchReplicaSpecs.Worker.template.spec"
TERM = f"{SPEC}.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[0]"


@pytest.mark.parametrize(
    ("spec", "selector", "models"),
    [
        ({}, {}, []),
        ({"nodeSelector": {"zone": "a", "disk": "ssd"}}, {"zone": "a", "disk": "ssd"}, []),
        ({"nodeSelector": {GPU: "A100"}}, {}, ["A100"]),
        ({"nodeSelector": {"cloud.google.com/gke-accelerator": "T4"}}, {}, ["T4"]),
        ({"affinity": required(expr(GPU, "In", "A100", "V100", "A100"))}, {}, ["A100", "V100"]),
        ({"affinity": required(expr("zone", "In", "b"))}, {"zone": "b"}, []),
        # both: a node must meet both, so the models are those both allow
        (
            {
                "nodeSelector": {"zone": "a"},
                "affinity": required(expr(GPU, "In", "A100", "V100"), expr("disk", "In", "ssd")),
            },
            {"zone": "a", "disk": "ssd"},
            ["A100", "V100"],
        ),
        (
            {"nodeSelector": {GPU: "V100"}, "affinity": required(expr(GPU, "In", "A100", "V100"))},
            {},
            ["V100"],
        ),
    ],
)
@pytest.mark.parametrize("dialect", ["kubeflow", "t9k"])
def test_pod_template_constraints(
    dialect: str, spec: dict[str, Any], selector: dict[str, str], models: list[str]
) -> None:
    payload = (kubeflow if dialect == "kubeflow" else t9k)(pod(**spec))
    result = translate(payload)
    assert result.dialect == dialect
    assert result.errors == [], result.errors
    assert result.warnings == [], result.warnings
    role = result.spec.roles[0]
    assert role.node_selector == [EnvVar(name=k, value=v) for k, v in selector.items()]
    assert role.resources.gpu_types == models


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (
            {"affinity": required(expr("rack", "NotIn", "r1"))},
            f"{TERM}.matchExpressions[0]",
            ["rack NotIn (r1)", "kept but not applied"],
        ),
        (
            {"affinity": required(expr("rack", "Exists"))},
            f"{TERM}.matchExpressions[0]",
            ["rack Exists"],
        ),
        (
            {"affinity": required(expr("rack", "In", "r1", "r2"))},
            f"{TERM}.matchExpressions[0]",
            ["rack In (r1, r2)"],
        ),
        (
            {"affinity": required(expr(GPU, "In", "A100"), terms=2)},
            f"{SPEC}.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms",
            ["2 nodeSelectorTerms"],
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            f"{SPEC}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
            ["required node constraints only"],
        ),
        ({"affinity": {"podAntiAffinity": {}}}, f"{SPEC}.affinity.podAntiAffinity", ["other pods"]),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {
                            "nodeSelectorTerms": [
                                {"matchFields": [expr("metadata.name", "In", "n1")]}
                            ]
                        }
                    }
                }
            },
            f"{TERM}.matchFields",
            ["labels only"],
        ),
        ({"tolerations": []}, f"{SPEC}.tolerations", ["kept but not applied"]),
    ],
)
def test_what_cannot_be_applied_is_a_warning_at_its_path(
    spec: dict[str, Any], path: str, words: list[str]
) -> None:
    result = translate(kubeflow(pod(**spec)))
    assert result.errors == [], result.errors
    assert [w.path for w in result.warnings] == [path], result.warnings
    for word in words:
        assert word in result.warnings[0].message, result.warnings[0].message
    assert result.spec.roles[0].node_selector == []
    assert result.spec.roles[0].resources.gpu_types == []


def test_gpu_model_on_a_task_without_gpus_is_a_warning() -> None:
    result = translate(kubeflow(pod(0, nodeSelector={GPU: "A100"})))
    assert [w.path for w in result.warnings] == [f"{SPEC}.containers[0].resources"]
    assert "asks for no GPUs" in result.warnings[0].message


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"nodeSelector": ["zone=a"]}, f"{SPEC}.nodeSelector"),
        ({"nodeSelector": {"replicas": 2}}, f"{SPEC}.nodeSelector.replicas"),
        ({"affinity": "anywhere"}, f"{SPEC}.affinity"),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: {}}}},
            f"{SPEC}.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms",
        ),
        (
            {"affinity": required({"operator": "In", "values": ["a"]})},
            f"{TERM}.matchExpressions[0].key",
        ),
        ({"affinity": required(expr("zone", "In"))}, f"{TERM}.matchExpressions[0].values"),
        (
            {"affinity": required({"key": "zone", "operator": "In", "values": "a"})},
            f"{TERM}.matchExpressions[0].values",
        ),
        (
            {"nodeSelector": {GPU: "T4"}, "affinity": required(expr(GPU, "In", "A100"))},
            f"{TERM}.matchExpressions[0]",
        ),
    ],
)
def test_malformed_constraints_are_errors_at_their_path(spec: dict[str, Any], path: str) -> None:
    result = translate(kubeflow(pod(**spec)))
    assert [e.path for e in result.errors] == [path], result.errors


def test_field_paths_point_at_where_the_constraint_was_written() -> None:
    payload = kubeflow(
        pod(
            nodeSelector={"zone": "a"},
            affinity=required(expr("disk", "In", "ssd"), expr(GPU, "In", "T4")),
        )
    )
    assert field_path("kubeflow", payload, "Worker", "node_selector") == f"{SPEC}.nodeSelector.zone"
    assert field_path("kubeflow", payload, "Worker", "gpu_types") == (f"{TERM}.matchExpressions[1]")
    only_affinity = kubeflow(pod(affinity=required(expr("disk", "In", "ssd"))))
    assert field_path("kubeflow", only_affinity, "Worker", "node_selector") == (
        f"{TERM}.matchExpressions[0]"
    )
    t9k_payload = t9k(pod(nodeSelector={GPU: "A100"}))
    assert field_path("t9k", t9k_payload, "worker", "gpu_types") == (
        "$.spec.replicaSpecs[0].template.spec.nodeSelector['nvidia.com/gpu.product']"
    )


# ------------------------------------------------------------------------ other dialects


def v2(hived: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 2,
        "name": "j",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "ubuntu"}],
        "taskRoles": {
            "train": {
                "instances": 1,
                "dockerImage": "img",
                "commands": ["x"],
                "resourcePerInstance": {"cpu": 1, "memoryMB": 1024, "gpu": 1},
            }
        },
        "extras": {"hivedScheduler": hived},
    }


HIVED = "$.extras.hivedScheduler"


def test_openpai_v2_hived_sku_type_is_the_roles_gpu_type() -> None:
    result = translate(
        v2({"jobPriorityClass": "prod", "taskRoles": {"train": {"skuType": "V100", "skuNum": 1}}})
    )
    assert result.errors == []
    assert result.spec.roles[0].resources.allowed_gpu_types() == ["V100"]
    assert [w.path for w in result.warnings] == [
        f"{HIVED}.jobPriorityClass",
        f"{HIVED}.taskRoles.train.skuNum",
    ]
    # the older spelling
    legacy = translate(v2({"taskRoles": {"train": {"gpuType": "K80"}}}))
    assert legacy.spec.roles[0].resources.gpu_type == "K80"
    assert (
        field_path(
            "openpai_v2", v2({"taskRoles": {"train": {"skuType": "V100"}}}), "train", "gpu_type"
        )
        == f"{HIVED}.taskRoles.train.skuType"
    )


@pytest.mark.parametrize(
    ("hived", "errors", "warnings"),
    [
        ({"taskRoles": {"train": {"skuType": 3}}}, [f"{HIVED}.taskRoles.train.skuType"], []),
        ({"taskRoles": {"train": "V100"}}, [f"{HIVED}.taskRoles.train"], []),
        ({"taskRoles": []}, [f"{HIVED}.taskRoles"], []),
        ("V100", [HIVED], []),
        ({"taskRoles": {"other": {"skuType": "V100"}}}, [], [f"{HIVED}.taskRoles.other"]),
    ],
)
def test_openpai_v2_hived_problems(hived: Any, errors: list[str], warnings: list[str]) -> None:
    result = translate(v2(hived))
    assert [e.path for e in result.errors] == errors
    assert [w.path for w in result.warnings] == warnings
    assert result.spec.roles[0].resources.gpu_type is None


def test_native_gpu_types_and_node_selector() -> None:
    payload = {
        "name": "n",
        "roles": [
            {
                "name": "w",
                "command": "x",
                "resources": {"gpu": 1, "gpu_types": ["A100", "H100"]},
                "node_selector": [{"name": "zone", "value": "a"}],
            }
        ],
    }
    result = translate(payload)
    assert result.dialect == "native"
    assert result.errors == []
    role = result.spec.roles[0]
    assert role.resources.gpu_types == ["A100", "H100"]
    assert role.node_selector == [EnvVar(name="zone", value="a")]
    assert field_path("native", payload, "w", "gpu_types") == "$.roles[0].resources.gpu_types"
    assert field_path("native", payload, "w", "node_selector") == "$.roles[0].node_selector"


def test_native_blank_models_and_label_names_are_errors() -> None:
    payload = {
        "name": "n",
        "roles": [
            {
                "name": "w",
                "command": "x",
                "resources": {"gpu": 1, "gpu_types": ["A100", " "]},
                "node_selector": [{"name": "", "value": "a"}],
            }
        ],
    }
    result = translate(payload)
    assert [e.path for e in result.errors] == [
        "$.roles[0].resources.gpu_types[1]",
        "$.roles[0].node_selector[0].name",
    ]


def test_dlc_gpu_type_is_read_as_before() -> None:
    payload = {
        "DisplayName": "d",
        "JobType": "PyTorchJob",
        "UserCommand": "python t.py",
        "JobSpecs": [
            {
                "Type": "Worker",
                "Image": "python:3.11",
                "PodCount": 1,
                "ResourceConfig": {"CPU": "2", "Memory": "4Gi", "GPU": "1", "GPUType": "V100"},
            }
        ],
    }
    result = translate(payload)
    assert result.errors == []
    assert result.spec.roles[0].resources.allowed_gpu_types() == ["V100"]
