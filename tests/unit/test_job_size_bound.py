"""A job holds at most MAX_JOB_TASKS tasks (Kubernetes' bound on an Indexed Job): one
asking for more is refused where it is written, on every backend, and a view of one
refused so (on record, spec and all) lists no more than that."""

from __future__ import annotations

from typing import Any

from trainyard_common.auth import Identity
from trainyard_common.cluster import local_cluster
from trainyard_common.dialects import kubeflow, openpai, t9k, translate, validate_native
from trainyard_common.dialects.translation import MAX_JOB_TASKS
from trainyard_common.events import JobRejected, JobSubmitted
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.handlers import Deps, submit_job
from trainyard_validation.domain.rules import decide


def spec(*roles: tuple[str, int, int | None]) -> JobSpec:
    return JobSpec(
        name="big",
        roles=[
            RoleSpec(name=name, replicas=n, max_replicas=most, command="true")
            for name, n, most in roles
        ],
    )


def test_a_job_of_more_tasks_than_a_job_holds_is_refused_at_its_largest_role() -> None:
    assert validate_native(spec(("w", MAX_JOB_TASKS, None))) == []
    [error] = validate_native(spec(("ps", 2, None), ("w", MAX_JOB_TASKS - 1, None)))
    assert (error.path, error.code) == ("$.roles[1].replicas", "too_many_tasks")
    assert f"{MAX_JOB_TASKS + 1} tasks" in error.message
    # An elastic role counts at the most it may grow to.
    [error] = validate_native(spec(("w", 1, MAX_JOB_TASKS + 1)))
    assert (error.path, error.code) == ("$.roles[0].max_replicas", "too_many_tasks")


async def test_intake_refuses_it_without_a_cluster_to_check_against() -> None:
    """On Kubernetes intake has no cluster of its own to check: the bound still holds,
    named where the job writes it."""
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2**31 - 1,
                    "template": {
                        "spec": {
                            "containers": [{"name": "pytorch", "image": "i", "command": ["true"]}]
                        }
                    },
                }
            }
        },
    }

    async def publish(event: Any) -> int:
        return 1

    deps = Deps(publish=publish, owners=InMemoryOwnerRegistry())
    assert deps.cluster is None
    result = await submit_job(job, Identity("alice"), deps)
    assert [(e.path, e.code) for e in result.errors] == [
        ("$.spec.pytorchReplicaSpecs.Worker.replicas", "too_many_tasks")
    ]


def test_a_view_of_a_refused_job_lists_at_most_as_many_tasks_as_a_job_holds() -> None:
    """All its roles together: 40 roles of 2**31 - 1 fit a 26 kB event."""
    roles = [{"name": f"r{i}", "replicas": 2**31 - 1} for i in range(40)]
    view = {"id": "j", "name": "big", "user": "u", "state": "REJECTED", "spec": {"roles": roles}}
    shown = openpai.render_status(view)["taskRoles"]
    assert sum(len(role["taskStatuses"]) for role in shown.values()) == MAX_JOB_TASKS
    attempt = openpai.render_job_attempt(view, 1)["taskRoles"]
    assert sum(len(role["taskStatuses"]) for role in attempt.values()) == MAX_JOB_TASKS
    assert len(kubeflow.render("pytorchjobs", view)["status"]["replicaStatuses"]) == 40
    assert sum(len(t["replicas"]) for t in t9k.t9k_status(view)["tasks"]) == MAX_JOB_TASKS


def test_validation_refuses_it_in_every_dialect_as_intake_does() -> None:
    """The dry run and validation make the same check as intake's, an elastic role
    counted at its largest (the cluster's check counts it at its smallest)."""
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "elastic", "namespace": "default"},
        "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": MAX_JOB_TASKS + 1},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [{"name": "pytorch", "image": "i", "command": ["true"]}]
                        }
                    },
                }
            },
        },
    }
    assert validation_errors(job) == [("$.spec.elasticPolicy.maxReplicas", "too_many_tasks")]


def validation_errors(job: dict[str, Any]) -> list[tuple[str, str]]:
    """What validation refuses a job for, its translation being clean."""
    translation = translate(job, user="u")
    assert translation.errors == [], translation.errors
    submitted = JobSubmitted(
        job_id="j", spec=translation.spec, dialect=translation.dialect,
        dialect_key=translation.key, original=job,
    )  # fmt: skip
    result = decide(submitted, local_cluster())
    assert isinstance(result, JobRejected), result
    return [(e.path, e.code) for e in result.errors]


def t9k_elastic(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "PyTorchTrainingJob",
        "metadata": {"name": "elastic", "namespace": "default"},
        "spec": {
            **spec,
            "replicaSpecs": [
                {
                    "type": "worker",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "containers": [{"name": "pytorch", "image": "i", "command": ["true"]}]
                        }
                    },
                }
            ],
        },
    }


def test_an_elastic_role_over_the_bound_is_named_at_its_maximum_where_the_job_writes_it() -> None:
    bounds = {"enabled": True, "minReplicas": 1, "maxReplicas": MAX_JOB_TASKS + 1}
    for job, path in (
        (t9k_elastic({"elastic": bounds}), "$.spec.elastic.maxReplicas"),
        (t9k_elastic({"runMode": {"elastic": bounds}}), "$.spec.runMode.elastic.maxReplicas"),
        # spec.elastic turned off: runMode's bounds are the ones that apply.
        (
            t9k_elastic({"elastic": {"enabled": False}, "runMode": {"elastic": bounds}}),
            "$.spec.runMode.elastic.maxReplicas",
        ),
    ):
        assert validation_errors(job) == [(path, "too_many_tasks")]
