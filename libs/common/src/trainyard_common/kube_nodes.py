"""The cluster as Kubernetes has it, when the launcher runs tasks as pods there
(``YARD_LAUNCHER=kubernetes``): placement schedules onto, and validation checks
against, the cluster's own Nodes instead of the cluster file (whose queues still hold).

A Node becomes a :class:`NodeSpec`: its allocatable CPUs, memory and
``nvidia.com/gpu``, its GPU model from the label ``nvidia.com/gpu.product`` (what the
NVIDIA GPU feature discovery writes), its InternalIP and its labels. An unschedulable
(cordoned) node is drained. :class:`NodeWatch` follows the Nodes and reports each
change within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .cluster import ClusterSpec, NodeSpec
from .dialects.k8s_pod import quantity
from .jobspec import EnvVar

if TYPE_CHECKING:
    from kubernetes_asyncio import client

# The Kubernetes client is imported by the functions that talk to the API server: it is
# half of a service's start and some 65 MB of its memory, and placement and validation
# import this module whatever their cluster (tests/unit/test_kube_imports.py).

log = logging.getLogger("trainyard.kube_nodes")

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class KubeNode:
    spec: NodeSpec
    schedulable: bool


def node_spec(node: dict[str, Any]) -> KubeNode | None:
    """A Node (as the API serves it) as Trainyard's node; None when it has no name."""
    meta = node.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return None
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    cpu = quantity(allocatable.get("cpu")) or 0
    memory = quantity(allocatable.get("memory")) or 0
    gpus = quantity(allocatable.get(GPU_RESOURCE)) or 0
    labels = meta.get("labels") or {}
    address = next(
        (a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"),
        "127.0.0.1",
    )
    spec = NodeSpec(
        name=name,
        host_ip=address,
        cpu=float(cpu),
        memory_mb=int(memory // (1024 * 1024)),
        gpus=int(gpus),
        gpu_type=labels.get(GPU_PRODUCT_LABEL) if int(gpus) > 0 else None,
        labels=[EnvVar(name=k, value=v) for k, v in sorted(labels.items())],
    )
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    return KubeNode(spec, schedulable=not unschedulable)


async def load_client(kubeconfig: str | None = None) -> client.ApiClient:
    from kubernetes_asyncio import client, config

    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path)
    else:
        config.load_incluster_config()
    return client.ApiClient()


async def list_nodes(api: client.ApiClient) -> tuple[list[KubeNode], str]:
    from kubernetes_asyncio import client

    listed = await client.CoreV1Api(api).list_node()
    nodes = [n for n in (node_spec(api.sanitize_for_serialization(i)) for i in listed.items) if n]
    return nodes, listed.metadata.resource_version


async def cluster_from_nodes(base: ClusterSpec, kubeconfig: str | None = None) -> ClusterSpec:
    """``base`` (its queues) with the nodes Kubernetes has now."""
    api = await load_client(kubeconfig)
    try:
        nodes, _ = await list_nodes(api)
    finally:
        await api.close()
    return base.model_copy(update={"nodes": [n.spec for n in nodes], "runtime": "kubernetes"})


Changed = Callable[[dict[str, KubeNode]], Awaitable[None]]


class NodeWatch:
    """Calls ``on_change`` with every node whenever one is added, changed or removed
    (resumed after a disconnect, relisted when its version is gone)."""

    def __init__(self, on_change: Changed, kubeconfig: str | None = None) -> None:
        self.on_change = on_change
        self.kubeconfig = kubeconfig
        self.nodes: dict[str, KubeNode] = {}

    async def run(self, stop: asyncio.Event) -> None:
        api = await load_client(self.kubeconfig)
        try:
            while not stop.is_set():
                try:
                    await self._follow(api, stop)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - resume after any fault
                    log.warning("node watch: %r; resuming", exc)
                    await asyncio.sleep(1.0)
        finally:
            await api.close()

    async def _follow(self, api: client.ApiClient, stop: asyncio.Event) -> None:
        from kubernetes_asyncio import client, watch

        nodes, version = await list_nodes(api)
        self.nodes = {n.spec.name: n for n in nodes}
        await self.on_change(dict(self.nodes))
        while not stop.is_set():
            stream = watch.Watch().stream(
                client.CoreV1Api(api).list_node, resource_version=version, timeout_seconds=30
            )
            async for event in stream:
                body = event["raw_object"]
                version = (body.get("metadata") or {}).get("resourceVersion") or version
                if event["type"] == "ERROR":
                    return  # relist
                node = node_spec(body)
                if node is None:
                    continue
                if event["type"] == "DELETED":
                    self.nodes.pop(node.spec.name, None)
                else:
                    self.nodes[node.spec.name] = node
                await self.on_change(dict(self.nodes))
                if stop.is_set():
                    return
