"""Payloads of the Kubernetes-style dialects, shared by the tests that translate and
validate them: a pod template, and the Kubeflow and T9k jobs that hold one."""

from __future__ import annotations

from typing import Any


def pod(gpus: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "python:3.11",
                    "command": ["python", "t.py"],
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
            **spec,
        }
    }


def kubeflow(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}},
    }


def t9k(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "GenericJob",
        "metadata": {"name": "g"},
        "spec": {"replicaSpecs": [{"type": "worker", "replicas": 1, "template": template}]},
    }


def openpai_v2(**changes: Any) -> dict[str, Any]:
    """A one-role OpenPAI v2 job (``changes`` at its top level)."""
    return {
        "protocolVersion": 2,
        "name": "cloned",
        "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "python:3.11", "name": "img"}],
        "taskRoles": {
            "main": {
                "dockerImage": "img",
                "commands": ["true"],
                "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
            }
        },
        **changes,
    }
