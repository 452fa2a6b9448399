"""The Alibaba GPU trace (openb, cluster-trace-gpu-v2023) as the platform's own models.

placement_quality.py reads the trace into the scorers' integers (NodeState, Demand);
the speed and replay benchmarks drive the scheduler itself, so they need what it takes:
a ClusterSpec and one JobSpec per pod. Shared by placement_speed.py and
placement_replay.py (each puts this directory on sys.path when imported as a file).
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_placement.domain.gpu_share import MILLI, Demand
from trainyard_placement.domain.policies import POLICIES
from trainyard_placement.domain.scoring import (
    ClusterContext,
)
from trainyard_placement.domain.state import context_of

DATA_DIR = Path(os.environ.get("YARD_OPENB_DIR", "/work/shared/data/openb"))
DEFAULT_NODES = DATA_DIR / "openb_node_list_all_node.csv"
DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv"


@dataclass(frozen=True)
class TracePod:
    """One pod of the trace as a one-task job. Times are seconds from the trace's start,
    None where the list has no such column (or the pod never got one)."""

    name: str
    spec: JobSpec
    creation: int | None = None
    deletion: int | None = None
    scheduled: int | None = None


def load_cluster(path: Path, *, cpu_nodes: bool = False) -> ClusterSpec:
    """The node list; without ``cpu_nodes`` only the nodes with GPUs, the cluster the FGD
    paper's experiments (and placement_quality.py) run on: 1,213 nodes, 6,212 GPUs."""
    nodes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row.get("gpu") or 0)
            if not gpus and not cpu_nodes:
                continue
            nodes.append(NodeSpec(
                name=row["sn"], cpu=int(row["cpu_milli"]) / MILLI,
                memory_mb=int(row["memory_mib"]), gpus=gpus,
                gpu_type=(row.get("model") or "").strip() or None if gpus else None,
            ))  # fmt: skip
    return ClusterSpec(nodes=nodes)


def resources(
    cpu_milli: int,
    memory_mib: int,
    gpus: int = 0,
    gpu_milli: int = MILLI,
    gpu_types: Sequence[str] = (),
) -> Resources:
    """The trace's integers as a task's Resources; Demand.of gives the same integers back.
    ``gpu_types``: the models the pod may use (any of them; none: any model)."""
    milli = min(gpu_milli or MILLI, MILLI)
    gpu: float = 0 if not gpus or milli <= 0 else (milli / MILLI if milli < MILLI else gpus)
    return Resources(
        cpu=cpu_milli / MILLI,
        memory_mb=memory_mib,
        gpu=gpu,
        gpu_types=list(gpu_types) if gpu else [],
    )


def job(name: str, res: Resources, replicas: int = 1) -> JobSpec:
    return JobSpec(
        name=name, roles=[RoleSpec(name="task", replicas=replicas, resources=res, command="true")]
    )


def load_pods(path: Path) -> list[TracePod]:
    """Rows of a pod list, in file order. A ``gpu_spec`` ("V100M16|V100M32") lists the
    models a pod may use, any one of them: the task's ``gpu_types`` (a model listed twice,
    as a few rows do, once)."""
    pods = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            spec = (row.get("gpu_spec") or "").split("|")
            models = list(dict.fromkeys(m.strip() for m in spec if m.strip()))
            res = resources(
                int(row["cpu_milli"]), int(row.get("memory_mib") or 0),
                int(row.get("num_gpu") or 0), int(row.get("gpu_milli") or MILLI), models,
            )  # fmt: skip
            pods.append(TracePod(
                row["name"], job(row["name"], res),
                _time(row, "creation_time"), _time(row, "deletion_time"),
                _time(row, "scheduled_time"),
            ))  # fmt: skip
    return pods


def _time(row: dict[str, str], column: str) -> int | None:
    value = (row.get(column) or "").strip()
    return int(value) if value else None


def demands(specs: Iterable[JobSpec]) -> list[Demand]:
    return [
        Demand.of(role.resources)
        for spec in specs
        for role in spec.roles
        for _ in range(role.replicas)
    ]


def context_for(cluster: ClusterSpec, specs: Sequence[JobSpec]) -> ClusterContext:
    """The target workload of the fragmentation-aware policies: the shapes of ``specs``
    (the pod list, as placement_quality.py takes it), and the normalisation spec as
    SchedulerState.context computes it."""
    return context_of(cluster.nodes, Counter(demands(specs)))


def parse_policy(text: str) -> str:
    name = text.strip().lower()
    if name not in POLICIES:
        raise argparse.ArgumentTypeError(f"unknown policy {name}; known: {', '.join(POLICIES)}")
    return name
