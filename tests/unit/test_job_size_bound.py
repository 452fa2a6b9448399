"""A job holds at most MAX_JOB_TASKS tasks (Kubernetes' bound on an Indexed Job): one
asking for more is refused where it is written, on every backend, and a view of one
refused so (on record, spec and all) lists no more than that."""

from __future__ import annotations

import time
from typing import Any

from trainyard_common.auth import Identity
from trainyard_common.dialects import kubeflow, openpai, t9k, validate_native
from trainyard_common.dialects.translation import MAX_JOB_TASKS
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.handlers import Deps, submit_job


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
    assert error.code == "too_many_tasks"


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
    roles = [{"name": "worker", "replicas": 2**31 - 1}]
    view = {"id": "j", "name": "big", "user": "u", "state": "REJECTED", "spec": {"roles": roles}}
    started = time.monotonic()
    shown = openpai.render_status(view)["taskRoles"]["worker"]["taskStatuses"]
    assert len(shown) == MAX_JOB_TASKS
    status = kubeflow.render("pytorchjobs", view)["status"]
    assert sum(status["replicaStatuses"]["worker"].values()) == 0
    assert t9k.t9k_status(view) is not None
    assert time.monotonic() - started < 30  # 2**31 of them would not end
