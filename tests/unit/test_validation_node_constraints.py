"""Validation of GPU model lists and node selectors against the cluster: a list with no
node of any of its models, or a selector no node matches, is an error at the field as the
user wrote it, in every dialect that can write one."""

from __future__ import annotations

from typing import Any

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.dialects import translate
from trainyard_common.events import JobAccepted, JobRejected, JobSubmitted
from trainyard_common.jobspec import EnvVar
from trainyard_validation.domain.rules import decide

from ..support.payloads import kubeflow, pod, t9k

CLUSTER = ClusterSpec(
    nodes=[
        NodeSpec(
            name="a100",
            cpu=32,
            memory_mb=100_000,
            gpus=8,
            gpu_type="A100",
            labels=[EnvVar(name="zone", value="a")],
        ),
        NodeSpec(
            name="t4",
            cpu=16,
            memory_mb=64_000,
            gpus=2,
            gpu_type="T4",
            labels=[EnvVar(name="zone", value="b"), EnvVar(name="disk", value="ssd")],
        ),
        NodeSpec(name="cpu", cpu=64, memory_mb=50_000, labels=[EnvVar(name="zone", value="b")]),
    ]
)


def submitted(payload: dict[str, Any]) -> JobSubmitted:
    t = translate(payload, user="alice")
    assert t.errors == [], t.errors
    return JobSubmitted(
        event_id="ev",
        job_id="job",
        spec=t.spec,
        dialect=t.dialect,
        dialect_key=t.key,
        original=payload,
        translation_errors=t.errors,
        warnings=t.warnings,
    )


def native(**resources: Any) -> dict[str, Any]:
    selector = resources.pop("selector", {})
    return {
        "name": "n",
        "roles": [
            {"name": "a", "command": "x"},
            {
                "name": "b",
                "command": "x",
                "resources": {"gpu": 1, **resources},
                "node_selector": [{"name": k, "value": v} for k, v in selector.items()],
            },
        ],
    }


def gpu_affinity(*models: str, key: str = "nvidia.com/gpu.product") -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["b"]},
                            {"key": key, "operator": "In", "values": list(models)},
                        ]
                    }
                ]
            }
        }
    }


def v2(sku: str) -> dict[str, Any]:
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
        "extras": {"hivedScheduler": {"taskRoles": {"train": {"skuType": sku}}}},
    }


KF_SPEC = "$.spec.pytorchReplicaSpecs.Worker.template.spec"
KF_TERM = (
    KF_SPEC + ".affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions"
)


@pytest.mark.parametrize(
    ("payload", "path", "code", "words"),
    [
        (
            native(gpu_types=["H100", "B200"]),
            "$.roles[1].resources.gpu_types",
            "unknown_gpu_type",
            ["'H100', 'B200'", "A100, T4"],
        ),
        # the single-model field is still named when it is the one given
        (native(gpu_type="H100"), "$.roles[1].resources.gpu_type", "unknown_gpu_type", ["'H100'"]),
        (
            native(selector={"zone": "c"}),
            "$.roles[1].node_selector",
            "no_matching_node",
            ["zone=c", "disk=ssd, zone=a, zone=b"],
        ),
        (
            native(selector={"zone": "a", "disk": "ssd"}),
            "$.roles[1].node_selector",
            "no_matching_node",
            ["disk=ssd, zone=a"],
        ),
        # the selector matches nodes, but none of the allowed model: the model is named
        (
            native(gpu_types=["A100"], selector={"zone": "b"}),
            "$.roles[1].resources.gpu_types",
            "no_fit",
            ["node selector zone=b", "(A100)"],
        ),
        # of the selected nodes the largest T4 node has 2 GPUs
        (
            native(gpu=4, gpu_types=["T4", "A100"], selector={"zone": "b"}),
            "$.roles[1].resources.gpu",
            "no_fit",
            ["4 GPU (T4 or A100)", "is 2"],
        ),
        (
            kubeflow(pod(affinity=gpu_affinity("H100"))),
            KF_TERM + "[1]",
            "unknown_gpu_type",
            ["'H100'"],
        ),
        (
            kubeflow(pod(nodeSelector={"nvidia.com/gpu.product": "H100"})),
            KF_SPEC + ".nodeSelector['nvidia.com/gpu.product']",
            "unknown_gpu_type",
            ["'H100'"],
        ),
        (
            kubeflow(pod(nodeSelector={"rack": "r9"})),
            KF_SPEC + ".nodeSelector.rack",
            "no_matching_node",
            ["rack=r9"],
        ),
        (
            kubeflow(pod(affinity=gpu_affinity("A100"))),
            KF_TERM + "[1]",
            "no_fit",
            ["zone=b", "(A100)"],
        ),
        (
            t9k(pod(nodeSelector={"zone": "c"})),
            "$.spec.replicaSpecs[0].template.spec.nodeSelector.zone",
            "no_matching_node",
            ["zone=c"],
        ),
        (
            v2("H100"),
            "$.extras.hivedScheduler.taskRoles.train.skuType",
            "unknown_gpu_type",
            ["'H100'"],
        ),
    ],
)
def test_constraint_no_node_meets_is_an_error_at_its_field(
    payload: dict[str, Any], path: str, code: str, words: list[str]
) -> None:
    result = decide(submitted(payload), CLUSTER)
    assert isinstance(result, JobRejected), result
    assert [(e.path, e.code) for e in result.errors] == [(path, code)], result.errors
    for word in words:
        assert word in result.errors[0].message, result.errors[0].message


@pytest.mark.parametrize(
    "payload",
    [
        native(gpu_types=["H100", "t4"]),  # one allowed model is enough; case aside
        native(gpu_type="a100"),
        native(gpu_types=["T4"], selector={"zone": "b", "disk": "ssd"}),
        native(gpu=0, gpu_types=["H100"]),  # asks for no GPU of it
        kubeflow(pod(affinity=gpu_affinity("T4", "H100"))),
        kubeflow(pod(nodeSelector={"zone": "a", "trainyard.dev/gpu-type": "A100"})),
        t9k(pod(nodeSelector={"disk": "ssd"})),
        v2("T4"),
    ],
)
def test_constraint_some_node_meets_is_accepted(payload: dict[str, Any]) -> None:
    result = decide(submitted(payload), CLUSTER)
    assert isinstance(result, JobAccepted), result
