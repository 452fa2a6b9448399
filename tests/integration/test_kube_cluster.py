"""The project's own Kubernetes test cluster (tools/kube + KWOK, libs/stack kube.py),
real through and through: nodes from a cluster file with their GPUs, pods bound by
nodeName that complete or fail as their annotations say, the controller manager's
service accounts, EndpointSlices and garbage collection, kubectl and helm."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainyard_common.cluster import NodeSpec
from trainyard_stack.kube import EXIT_CODE, RUN_DURATION, KubeCluster, ensure_kube_binaries

NS = "default"


def until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.2)


def pod(name: str, node: str, annotations: dict[str, str] | None = None, **meta: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, **meta},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "task", "image": "busybox"}],
        },
    }


def phase_of(http: httpx.Client, name: str, ns: str = NS) -> dict | None:
    answer = http.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return answer.json() if answer.status_code == 200 else None


def test_nodes_come_from_the_cluster_file_with_their_gpus(kube_cluster: KubeCluster) -> None:
    with kube_cluster.client() as http:

        def ready() -> dict[str, dict] | None:
            items = http.get("/api/v1/nodes").json()["items"]
            nodes = {n["metadata"]["name"]: n for n in items}
            ok = all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", [])
                )
                for n in nodes.values()
            )
            return nodes if ok and len(nodes) == 3 else None

        nodes = until(ready, what="three Ready nodes")
    gpu = nodes["kwok-gpu-0"]
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert gpu["metadata"]["labels"]["nvidia.com/gpu.product"] == "A100"
    assert gpu["status"]["allocatable"]["cpu"] == "16"
    assert nodes["kwok-gpu-1"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "TITANX"
    assert "nvidia.com/gpu" not in nodes["kwok-cpu-0"]["status"]["allocatable"]


def test_pods_complete_fail_or_run_as_their_annotations_say(kube_cluster: KubeCluster) -> None:
    with kube_cluster.client() as http:
        for body in (
            pod("ok", "kwok-gpu-0", {RUN_DURATION: "1s"}),
            pod("three", "kwok-cpu-0", {RUN_DURATION: "500ms", EXIT_CODE: "3"}),
            pod("forever", "kwok-cpu-0"),
        ):
            answer = http.post(f"/api/v1/namespaces/{NS}/pods", json=body)
            assert answer.status_code == 201, answer.text
        ok = until(
            lambda: (p := phase_of(http, "ok")) and p["status"].get("phase") == "Succeeded" and p
        )
        state = ok["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 0
        three = until(
            lambda: (p := phase_of(http, "three")) and p["status"].get("phase") == "Failed" and p
        )
        assert three["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        running = until(
            lambda: (p := phase_of(http, "forever")) and p["status"].get("phase") == "Running" and p
        )
        assert running["status"]["containerStatuses"][0]["state"].get("running") is not None
        time.sleep(2.0)
        assert phase_of(http, "forever")["status"]["phase"] == "Running"  # type: ignore[index]
        for name in ("ok", "three", "forever"):
            http.delete(f"/api/v1/namespaces/{NS}/pods/{name}")
        until(lambda: phase_of(http, "forever") is None, what="the pod deleted")


def test_the_controller_manager_does_its_part(kube_cluster: KubeCluster) -> None:
    with kube_cluster.client() as http:
        assert (
            http.post("/api/v1/namespaces", json={"metadata": {"name": "team-x"}}).status_code
            == 201
        )
        until(
            lambda: (
                http.get("/api/v1/namespaces/team-x/serviceaccounts/default").status_code == 200
            ),
            what="the default service account",
        )
        # A headless Service's EndpointSlice names its running pod.
        owner = http.post(
            "/api/v1/namespaces/team-x/configmaps", json={"metadata": {"name": "owner"}}
        ).json()
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
        }
        body = pod("member", "kwok-gpu-1", labels={"job": "j1"}, ownerReferences=[ref])
        body["spec"]["hostname"], body["spec"]["subdomain"] = "member", "j1"
        assert http.post("/api/v1/namespaces/team-x/pods", json=body).status_code == 201
        service = {
            "metadata": {"name": "j1"},
            "spec": {
                "clusterIP": "None",
                "selector": {"job": "j1"},
                "publishNotReadyAddresses": True,
            },
        }
        assert http.post("/api/v1/namespaces/team-x/services", json=service).status_code == 201

        def slice_names() -> list[str]:
            items = http.get(
                "/apis/discovery.k8s.io/v1/namespaces/team-x/endpointslices",
                params={"labelSelector": "kubernetes.io/service-name=j1"},
            ).json()["items"]
            return [e.get("hostname") for s in items for e in s.get("endpoints") or []]

        assert until(slice_names, what="an EndpointSlice") == ["member"]
        # Deleting the owner collects its pod.
        http.delete("/api/v1/namespaces/team-x/configmaps/owner")
        until(lambda: phase_of(http, "member", "team-x") is None, what="the owned pod collected")


def test_kubectl_and_helm_from_the_build(kube_cluster: KubeCluster) -> None:
    nodes = kube_cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    assert sorted(nodes) == ["node/kwok-cpu-0", "node/kwok-gpu-0", "node/kwok-gpu-1"]
    version = kube_cluster.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.34.4"' in version
    helm = subprocess.run(
        [str(ensure_kube_binaries() / "helm"), "version", "--short"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert helm.stdout.startswith("v3.")


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    cluster = KubeCluster(tmp_path / "kube", nodes=[NodeSpec(name="n", cpu=2, memory_mb=2048)])
    cluster.start()
    pids = cluster.pids
    assert len(pids) == 5
    cluster.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
