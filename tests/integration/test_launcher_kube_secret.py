"""The Kubernetes backend against the real API server (the project's build, KWOK
nodes): a task whose command line carries the job's secrets gets it in a Secret made
before its pod (owned by the attempt's owner until then), so that a launcher stopped
between the two never leaves a pod without its Secret; once the pod is made, the
Secret is the pod's and goes with it (a finished attempt's owner stays, and a clean-up
policy deletes the pod alone); a Secret the API server refuses (past 1 MiB) refuses
the task and makes no pod."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid

import pytest

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import EnvVar, JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import (
    AttemptEnd,
    AttemptSpec,
    LaunchRefused,
    TaskLaunch,
    TaskRef,
)
from trainyard_launcher.adapters.kubernetes import KubernetesBackend, KubeSettings
from trainyard_launcher.domain.pods import command_secret_name, owner_name, pod_name
from trainyard_stack.kube import KubeCluster

NAMESPACE = "secret-launch"


def read(kube: KubeCluster, kind: str, name: str) -> dict | None:
    with kube.client() as http:
        answer = http.get(f"/api/v1/namespaces/{NAMESPACE}/{kind}/{name}")
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    return answer.json()


def a_launch(job_id: str, command: str, token: str) -> TaskLaunch:
    spec = JobSpec(
        name="j", image="busybox", roles=[RoleSpec(name="w", command="x")],
        secrets=[EnvVar(name="t", value=token)],
    )  # fmt: skip
    placement = TaskPlacement(role="w", index=0, node="kwok-cpu-0", host_ip="x")
    return TaskLaunch(
        ref=TaskRef(job_id, 1, "w", 0), attempt=AttemptSpec(job_id, 1, spec, (placement,)),
        placement=placement, env={"PAI_JOB_NAME": "j"}, command=command,
        secret_values=(token,), carries_secrets=True,
    )  # fmt: skip


@pytest.fixture
async def backend(kube_cluster: KubeCluster):  # type: ignore[no-untyped-def]
    made = KubernetesBackend(
        KubeSettings(namespace=NAMESPACE, kubeconfig=str(kube_cluster.kubeconfig))
    )
    await made.start()
    yield made
    await made.close()


async def test_the_secret_is_made_first_and_goes_with_its_pod(
    backend: KubernetesBackend, kube_cluster: KubeCluster
) -> None:
    job_id = uuid.uuid4().hex
    token = f"tok-{uuid.uuid4().hex}"
    launch = a_launch(job_id, f"echo {token}", token)
    name = command_secret_name(job_id, 1, "w", 0)
    try:
        # As if an earlier try had made the Secret and stopped before the pod: the
        # launch goes on past it.
        await backend.open_attempt(launch.attempt)
        owner = read(kube_cluster, "configmaps", owner_name(job_id, 1))
        assert owner is not None  # a lone task, but a job with secrets: it has one
        await backend._command_secret(launch, NAMESPACE, owner["metadata"]["uid"])
        await backend.launch(launch)
        secret = read(kube_cluster, "secrets", name)
        pod = read(kube_cluster, "pods", pod_name(job_id, 1, "w", 0))
        assert secret is not None and pod is not None
        assert base64.b64decode(secret["data"]["command"]).decode().endswith(f"echo {token}")
        assert token not in str(pod)
        [by_secret] = secret["metadata"]["ownerReferences"]
        assert (by_secret["kind"], by_secret["uid"]) == ("Pod", pod["metadata"]["uid"])
        # The job finished: its owner and pod stay (the log); the clean-up policy deletes
        # the pod, and the Secret with the secret in it goes with it, not with the owner.
        await backend.close_attempt(launch.attempt, AttemptEnd.FINISHED)
        assert await backend.clean_task(launch.ref)
        deadline = time.monotonic() + 30
        while read(kube_cluster, "secrets", name) is not None:
            assert time.monotonic() < deadline, "the command's Secret outlived its pod"
            await asyncio.sleep(0.2)
        assert read(kube_cluster, "configmaps", owner_name(job_id, 1)) is not None
    finally:
        await backend.close_attempt(launch.attempt, AttemptEnd.STOPPED)


async def test_a_secret_the_api_server_refuses_refuses_the_task_and_makes_no_pod(
    backend: KubernetesBackend, kube_cluster: KubeCluster
) -> None:
    job_id = uuid.uuid4().hex
    token = f"tok-{uuid.uuid4().hex}"
    launch = a_launch(job_id, f"echo {token} {'x' * (1024 * 1024 + 1)}", token)
    try:
        with pytest.raises(LaunchRefused, match="the cluster refused the command's Secret"):
            await backend.launch(launch)
        assert read(kube_cluster, "pods", pod_name(job_id, 1, "w", 0)) is None
    finally:
        await backend.close_attempt(launch.attempt, AttemptEnd.STOPPED)
