"""The dialects' own control verbs: a merge patch of a submitted T9k or Kubeflow job read
as pause / resume / scale, and turned into the generic commands."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainyard_common.dialects import kubeflow, t9k
from trainyard_common.dialects.k8s_pod import Control, merge_patch
from trainyard_common.events import PauseJob, ResumeJob, ScaleJob
from trainyard_intake.dialect_api.k8s_resources import control_commands


def _replica(rtype: str, replicas: int = 1, name: str = "main") -> dict[str, Any]:
    return {
        "type": rtype,
        "replicas": replicas,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": name,
                        "image": "python:3.11",
                        "command": ["python", "train.py"],
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                    }
                ]
            }
        },
    }


def generic() -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "GenericJob",
        "metadata": {"name": "g", "namespace": "demo"},
        "spec": {"replicaSpecs": [_replica("master"), _replica("worker", 2)]},
    }


def elastic_pytorch(**elastic: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "PyTorchTrainingJob",
        "metadata": {"name": "p", "namespace": "demo"},
        "spec": {
            "elastic": {"enabled": True, "minReplicas": 1, "maxReplicas": 4, **elastic},
            "replicaSpecs": [_replica("worker", 2, "python")],
        },
    }


def kubeflow_job(elastic: bool = True) -> dict[str, Any]:
    worker = {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [
                    {"name": "pytorch", "image": "python:3.11", "command": ["python", "t.py"]}
                ]
            }
        },
    }
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Worker": worker}}
    if elastic:
        spec["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 3}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "k", "namespace": "ml"},
        "spec": spec,
    }


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3]}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3]}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}  # untouched
    assert merge_patch({"a": 1}, ["x"]) == ["x"]


# ---------------------------------------------------------------------------------- T9k


@pytest.mark.parametrize(
    ("patch", "pause"),
    [
        ({"spec": {"runMode": {"pause": {"enabled": True}}}}, True),
        ({"spec": {"runMode": {"pause": {"enable": True}}}}, True),  # T9k's other spelling
        ({"spec": {"runMode": {"pause": {"enabled": False}}}}, False),
        ({"spec": {"runMode": {"pause": None}}}, False),  # removing pause resumes
    ],
)
def test_t9k_pause_and_resume(patch: dict[str, Any], pause: bool) -> None:
    control = t9k.control_from_patch(generic(), patch)
    assert control == Control(pause=pause)


def test_t9k_resume_specs_are_set_when_the_job_is_created_and_never_changed() -> None:
    """ "不可以更改 spec.runMode.pause.resumeSpecs" (T9k's manual)."""
    resume = [{"type": "worker", "command": ["python", "resume.py"]}]
    added = {"spec": {"runMode": {"pause": {"enabled": True, "resumeSpecs": resume}}}}
    [error] = t9k.control_from_patch(generic(), added).errors
    assert (error.path, error.code) == ("$.spec.runMode.pause.resumeSpecs", "immutable")
    job = merge_patch(generic(), {"spec": {"runMode": {"pause": {"resumeSpecs": resume}}}})
    pause = {"spec": {"runMode": {"pause": {"enabled": True}}}}
    assert t9k.control_from_patch(job, pause) == Control(pause=True)
    changed = {"spec": {"runMode": {"pause": {"enabled": True, "resumeSpecs": []}}}}
    assert t9k.control_from_patch(job, changed).errors
    # Taking pause away resumes the job, its resumeSpecs with it (not a change of them).
    paused = merge_patch(job, pause)
    assert t9k.control_from_patch(paused, {"spec": {"runMode": {"pause": None}}}) == Control(
        pause=False
    )
    assert t9k.control_from_patch(paused, {"spec": {"runMode": None}}) == Control(pause=False)
    # Kept, and said not to apply: Trainyard resumes replicas with their own commands.
    assert "$.spec.runMode.pause.resumeSpecs" in {w.path for w in t9k.translate_t9k(job).warnings}


def test_t9k_resume_of_a_job_created_paused() -> None:
    job = merge_patch(generic(), {"spec": {"runMode": {"pause": {"enabled": True}}}})
    assert t9k.control_from_patch(
        job, {"spec": {"runMode": {"pause": {"enabled": False}}}}
    ) == Control(pause=False)


def test_t9k_patch_without_a_verb_asks_for_nothing() -> None:
    assert t9k.control_from_patch(generic(), {}) == Control()
    assert t9k.control_from_patch(generic(), {"metadata": {"name": "g"}}) == Control()


def test_t9k_expected_replicas_scales_the_elastic_roles() -> None:
    for where in (
        {"elastic": {"expectedReplicas": 3}},
        {
            "runMode": {
                "elastic": {
                    "enabled": True,
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "expectedReplicas": 3,
                }
            }
        },
    ):
        job = (
            elastic_pytorch()
            if "elastic" in where
            else {
                **elastic_pytorch(),
                "spec": {
                    "replicaSpecs": elastic_pytorch()["spec"]["replicaSpecs"],
                    "runMode": {"elastic": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}},
                },
            }
        )
        assert t9k.control_from_patch(job, {"spec": where}) == Control(scale={"worker": 3})


def test_t9k_replica_count_of_an_elastic_role_scales_it() -> None:
    job = elastic_pytorch()
    patch = {"spec": {"replicaSpecs": [_replica("worker", 4, "python")]}}
    assert t9k.control_from_patch(job, patch) == Control(scale={"worker": 4})


def test_t9k_pause_and_scale_together() -> None:
    patch = {"spec": {"elastic": {"expectedReplicas": 2}, "runMode": {"pause": {"enabled": True}}}}
    assert t9k.control_from_patch(elastic_pytorch(), patch) == Control(
        pause=True, scale={"worker": 2}
    )


@pytest.mark.parametrize(
    ("job", "patch", "path", "code"),
    [
        # the size of a job that is not elastic is fixed
        (
            generic(),
            {"spec": {"replicaSpecs": [_replica("master"), _replica("worker", 3)]}},
            "$.spec.replicaSpecs[1].replicas",
            "immutable",
        ),
        # outside the elastic bounds: the translation's own rule names the field
        (
            elastic_pytorch(),
            {"spec": {"elastic": {"expectedReplicas": 9}}},
            "$.spec.elastic.expectedReplicas",
            "range",
        ),
        (
            elastic_pytorch(),
            {"spec": {"replicaSpecs": [_replica("worker", 9, "python")]}},
            "$.spec.replicaSpecs[0].replicas",
            "range",
        ),
        (
            generic(),
            {"spec": {"runMode": {"elastic": {"expectedReplicas": 2}}}},
            "$.spec.runMode.elastic.expectedReplicas",
            "immutable",
        ),
        # anything else is the job as created
        (
            generic(),
            {
                "spec": {
                    "replicaSpecs": [
                        _replica("master"),
                        {
                            **_replica("worker", 2),
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"name": "main", "image": "other", "command": ["x"]}
                                    ]
                                }
                            },
                        },
                    ]
                }
            },
            "$.spec.replicaSpecs[1].template.spec.containers[0].image",
            "immutable",
        ),
        (
            generic(),
            {"spec": {"scheduler": {"t9kScheduler": {"queue": "other"}}}},
            "$.spec.scheduler",
            "immutable",
        ),
        # labels and annotations change freely (as on any Kubernetes object); the name not
        (generic(), {"metadata": {"name": "other"}}, "$.metadata.name", "immutable"),
        # a mode the kind does not have
        (
            {
                **generic(),
                "kind": "BeamJob",
                "spec": {
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [{"name": "c", "image": "i", "command": ["x"]}]
                                }
                            }
                        }
                    }
                },
            },
            {"spec": {"runMode": {"pause": {"enabled": True}}}},
            "$.spec.runMode.pause",
            "unsupported_mode",
        ),
        (
            generic(),
            {"spec": {"runMode": {"pause": {"enabled": "yes"}}}},
            "$.spec.runMode.pause.enabled",
            "type",
        ),
        (generic(), ["not", "a", "patch"], "$", "type"),
    ],
)
def test_t9k_refusals_name_the_field(job: dict[str, Any], patch: Any, path: str, code: str) -> None:
    control = t9k.control_from_patch(job, patch)
    assert [(e.path, e.code) for e in control.errors] == [(path, code)], control.errors
    assert control.pause is None and not control.scale


def test_t9k_patch_leaves_the_resource_as_created_alone() -> None:
    job = generic()
    before = copy.deepcopy(job)
    t9k.control_from_patch(job, {"spec": {"runMode": {"pause": {"enabled": True}}}})
    assert job == before


# ------------------------------------------------------------------------------ Kubeflow


def test_kubeflow_suspend_pauses_and_resumes() -> None:
    job = kubeflow_job()
    assert kubeflow.control_from_patch(job, {"spec": {"runPolicy": {"suspend": True}}}) == Control(
        pause=True
    )
    assert kubeflow.control_from_patch(job, {"spec": {"runPolicy": {"suspend": False}}}) == Control(
        pause=False
    )


def test_kubeflow_elastic_worker_replicas_scale() -> None:
    patch = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}}
    assert kubeflow.control_from_patch(kubeflow_job(), patch) == Control(scale={"Worker": 3})


@pytest.mark.parametrize(
    ("job", "patch", "path", "code"),
    [
        (
            kubeflow_job(),
            {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 5}}}},
            "$.spec.pytorchReplicaSpecs.Worker.replicas",
            "range",
        ),
        (
            kubeflow_job(elastic=False),
            {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}},
            "$.spec.pytorchReplicaSpecs.Worker.replicas",
            "immutable",
        ),
        (
            kubeflow_job(),
            {"spec": {"elasticPolicy": {"maxReplicas": 9}}},
            "$.spec.elasticPolicy.maxReplicas",
            "immutable",
        ),
    ],
)
def test_kubeflow_refusals_name_the_field(
    job: dict[str, Any], patch: Any, path: str, code: str
) -> None:
    control = kubeflow.control_from_patch(job, patch)
    assert [(e.path, e.code) for e in control.errors] == [(path, code)], control.errors


# ----------------------------------------------------------------------- the commands


def test_commands_are_the_generic_ones() -> None:
    commands = control_commands(
        "job-1", Control(pause=True, scale={"w": 3, "a": 2}), "alice", "PATCH pytorchtrainingjobs/p"
    )
    assert [type(c) for c in commands] == [ScaleJob, ScaleJob, PauseJob]
    assert [(c.role, c.replicas) for c in commands[:2]] == [("a", 2), ("w", 3)]  # type: ignore[attr-defined]
    assert all(c.job_id == "job-1" and c.requested_by == "alice" for c in commands)
    assert "PATCH pytorchtrainingjobs/p" in commands[2].reason  # type: ignore[attr-defined]
    resume = control_commands("job-1", Control(pause=False), "alice", "x")
    assert [type(c) for c in resume] == [ResumeJob]
    assert control_commands("job-1", Control(), "alice", "x") == []


def test_a_paused_t9k_job_reads_back_as_paused() -> None:
    assert t9k.job_phase({"state": "PAUSED", "spec": {}}) == "Paused"
    assert t9k.job_phase({"state": "RUNNING", "spec": {}}) == "Running"
