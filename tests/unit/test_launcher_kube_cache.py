"""The Kubernetes backend's pod cache: a create's answer that the namespace's watch has
already overtaken must not take the pod back to its first state (a pod that ran and
ended while its create was being answered looked running forever: bench/pipeline.py
--kube hung on one of 300 such jobs)."""

from __future__ import annotations

import copy

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import TaskHandle, TaskRef
from trainyard_launcher.adapters.kubernetes import KubernetesBackend, KubeSettings
from trainyard_launcher.domain.pods import PodSettings, pod_manifest

JOB = "0123456789abcdef0123456789abcdef"


def created(uid: str = "uid-1") -> dict:
    pod = pod_manifest(
        spec=JobSpec(name="j", image="img", roles=[RoleSpec(name="w", command="true")]),
        job_id=JOB, attempt=1, placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"),
        env={}, command="true", namespace="ns", owner_uid=None, settings=PodSettings(),
    )  # fmt: skip
    pod["metadata"]["uid"] = uid
    pod["status"] = {"phase": "Pending"}
    return pod


def ended(pod: dict) -> dict:
    done = copy.deepcopy(pod)
    done["status"] = {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": "task", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ],
    }
    return done


REF = TaskRef(JOB, 1, "w", 0)


async def test_the_watch_state_is_kept_over_an_older_create_answer() -> None:
    backend = KubernetesBackend(KubeSettings())
    pod = created()
    backend._remember("ns", ended(pod))  # the watch saw it end first
    backend._remember("ns", pod, unless_seen=True)  # then the create's answer came
    status = await backend.poll(REF, TaskHandle(uid="uid-1"))
    assert not status.running and status.exit_code == 0


async def test_a_create_answer_fills_in_what_the_watch_has_not_seen() -> None:
    backend = KubernetesBackend(KubeSettings())
    backend._remember("ns", ended(created("old-uid")))  # an earlier pod of that name
    backend._remember("ns", created("uid-2"), unless_seen=True)
    assert (await backend.poll(REF, TaskHandle(uid="uid-2"))).running
    # And from the watch, the newest state always wins.
    backend._remember("ns", ended(created("uid-2")))
    assert not (await backend.poll(REF, TaskHandle(uid="uid-2"))).running
