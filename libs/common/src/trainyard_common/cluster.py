"""The cluster as configured: nodes with CPU, memory, GPUs and a port range, and queues.

Placement schedules onto it and validation checks jobs against it (a GPU type or queue
that exists, a task no larger than the largest node). ``YARD_CLUSTER`` names a YAML
file; without one the cluster is this machine, as the local backend runs it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from .jobspec import EnvVar, Model
from .sources import HOST_PATHS_ENV, read_host_paths


class NodeSpec(Model):
    name: str
    host_ip: str = "127.0.0.1"
    cpu: float
    memory_mb: int
    gpus: int = 0
    gpu_type: str | None = None
    # Below Linux's ephemeral range (32768-60999 by default), from which the kernel
    # gives every outgoing connection on the machine its local port: a task port drawn
    # there could be held by one (the task failed with "address already in use").
    port_range: tuple[int, int] = (20000, 32767)
    labels: list[EnvVar] = Field(default_factory=list)


class QueueQuota(Model):
    """What a queue is guaranteed; None in a field means no limit in that resource."""

    cpu: float | None = None
    memory_mb: int | None = None
    gpus: float | None = Field(None, description="GPUs; a share of one counts as its fraction.")


class QueueSpec(Model):
    """A queue (OpenPAI virtual cluster, DLC resource group) with its quota."""

    name: str
    quota: QueueQuota = Field(default_factory=QueueQuota)
    aliases: list[str] = Field(
        default_factory=list,
        description="Other names jobs may give the queue: a PAI-DLC quota id (ResourceId), "
        "an OpenPAI virtual cluster's or a Kueue LocalQueue's name.",
    )
    borrowing: bool = Field(
        True, description="Jobs may use idle capacity beyond the quota (reclaimable)."
    )
    preemption: bool = Field(
        True, description="A job may preempt lower-priority jobs of this queue."
    )


def _default_queues() -> list[str | QueueSpec]:
    return ["default"]


class ClusterSpec(Model):
    nodes: list[NodeSpec]
    # What runs the tasks (YARD_LAUNCHER): processes on the nodes, which cannot run an
    # image, or pods on Kubernetes.
    runtime: Literal["local", "kubernetes"] = "local"
    # On Kubernetes, the directories of the nodes whose paths pods may mount as data
    # sources (YARD_K8S_HOST_PATHS, the launcher's setting, read_host_paths): submission
    # refuses any other node path, as the launcher does.
    host_paths: tuple[str, ...] = ()
    # A plain name is a queue without a quota.
    queues: list[str | QueueSpec] = Field(default_factory=_default_queues)

    def gpu_types(self) -> set[str]:
        return {n.gpu_type for n in self.nodes if n.gpu_type and n.gpus > 0}

    def queue_names(self) -> list[str]:
        return [q if isinstance(q, str) else q.name for q in self.queues]

    def resolve_queue(self, name: str) -> str | None:
        """The queue a job naming ``name`` goes to (by its name or an alias), or None."""
        if name in self.queue_names():
            return name
        for q in self.queues:
            if isinstance(q, QueueSpec) and name in q.aliases:
                return q.name
        return None

    def queue(self, name: str) -> QueueSpec:
        """The queue's spec; a plain name, or a name the file does not list, has no quota."""
        for q in self.queues:
            if isinstance(q, QueueSpec) and q.name == name:
                return q
        return QueueSpec(name=name)


def _memory_mb() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 4096


def local_cluster() -> ClusterSpec:
    """This machine as one node (GPUs are declared in a cluster file, not guessed)."""
    return ClusterSpec(
        nodes=[
            NodeSpec(
                name=socket.gethostname() or "local",
                cpu=float(os.cpu_count() or 1),
                memory_mb=_memory_mb(),
            )
        ]
    )


def load_cluster(path: str | Path | None = None) -> ClusterSpec:
    path = path or os.environ.get("YARD_CLUSTER")
    if not path:
        cluster = local_cluster()
    else:
        data = yaml.safe_load(Path(path).read_text()) or {}
        cluster = ClusterSpec.model_validate(data)
    return cluster.model_copy(
        update={
            "runtime": current_runtime(),
            # Pods' setting: a local platform neither reads nor refuses it.
            "host_paths": current_host_paths() if current_runtime() == "kubernetes" else (),
        }
    )


def current_runtime() -> Literal["local", "kubernetes"]:
    """What runs this platform's tasks (YARD_LAUNCHER)."""
    return "kubernetes" if os.environ.get("YARD_LAUNCHER") == "kubernetes" else "local"


def current_host_paths() -> tuple[str, ...]:
    """The directories of the nodes pods may mount (YARD_K8S_HOST_PATHS), as the
    launcher reads it; ValueError (no start) for a value it would refuse."""
    return read_host_paths(os.environ.get(HOST_PATHS_ENV, ""))
