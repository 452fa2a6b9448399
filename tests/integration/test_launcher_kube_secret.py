"""The Kubernetes backend against the real API server (the project's build, KWOK
nodes): a task whose command line carries a secret gets it in a Secret its pod owns,
and a launch tried again after an earlier try made the pod but not its Secret (the
launcher killed between the two creates) makes the Secret, so the kubelet can start
the container."""

from __future__ import annotations

import base64
import uuid

import pytest

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import (
    AlreadyLaunched,
    AttemptEnd,
    AttemptSpec,
    TaskLaunch,
    TaskRef,
)
from trainyard_launcher.adapters.kubernetes import KubernetesBackend, KubeSettings
from trainyard_launcher.domain.pods import command_secret_name
from trainyard_stack.kube import KubeCluster

NAMESPACE = "secret-retry"


def read_secret(kube: KubeCluster, name: str) -> dict | None:
    with kube.client() as http:
        answer = http.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_a_launch_tried_again_makes_the_secret_the_earlier_try_did_not(
    kube_cluster: KubeCluster,
) -> None:
    backend = KubernetesBackend(
        KubeSettings(namespace=NAMESPACE, kubeconfig=str(kube_cluster.kubeconfig))
    )
    await backend.start()
    job_id = uuid.uuid4().hex
    token = f"tok-{uuid.uuid4().hex}"
    spec = JobSpec(name="j", image="busybox", roles=[RoleSpec(name="w", command="x")])
    placement = TaskPlacement(role="w", index=0, node="kwok-cpu-0", host_ip="x")
    attempt = AttemptSpec(job_id, 1, spec, (placement,))
    launch = TaskLaunch(
        ref=TaskRef(job_id, 1, "w", 0), attempt=attempt, placement=placement,
        env={"PAI_JOB_NAME": "j"}, command=f"echo {token}", secret_values=(token,),
    )  # fmt: skip
    name = command_secret_name(job_id, 1, "w", 0)
    try:
        launched = await backend.launch(launch)
        made = read_secret(kube_cluster, name)
        assert made is not None
        assert base64.b64decode(made["data"]["command"]).decode().endswith(f"echo {token}")
        assert made["metadata"]["ownerReferences"][0]["uid"] == launched.handle.uid
        # As if the first try had ended between the pod and its Secret.
        with kube_cluster.client() as http:
            http.delete(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}").raise_for_status()
        assert read_secret(kube_cluster, name) is None
        with pytest.raises(AlreadyLaunched):
            await backend.launch(launch)
        again = read_secret(kube_cluster, name)
        assert again is not None
        assert again["metadata"]["ownerReferences"][0]["uid"] == launched.handle.uid
    finally:
        await backend.close_attempt(attempt, AttemptEnd.STOPPED)
        await backend.close()
