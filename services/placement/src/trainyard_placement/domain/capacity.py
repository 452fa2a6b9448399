"""What the cluster has free, derived from its nodes and the allocations of placed jobs.

Nothing here is a running counter: a :class:`Snapshot` is a function of the cluster and
the set of allocations, so dropping a job's allocation is all it takes to release it,
and a restart that reloads the same allocations sees exactly the same free capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, Resources

from .gpu_share import MILLI, NodeState, gpu_request

# CPU is a float (0.5 cores); compare with a little slack so 0.1 + 0.2 fits into 0.3.
CPU_EPSILON = 1e-9


def gpu_count(resources: Resources) -> int:
    """GPU devices a task holds: a fraction (0 < gpu < 1) is a share of one device (see
    gpu_share), anything larger is whole devices, rounded up."""
    return gpu_request(resources.gpu)[0]


def gpu_milli(resources: Resources) -> int | None:
    """The milli-GPU a share holds on its one device; None for whole GPUs or none."""
    count, milli = gpu_request(resources.gpu)
    return milli if count == 1 and milli < MILLI else None


def gpu_type_matches(wanted: str | None, node: NodeSpec) -> bool:
    if wanted is None:
        return True
    return node.gpu_type is not None and node.gpu_type.lower() == wanted.lower()


@dataclass(frozen=True)
class Allocation:
    """Everything one placed job holds: its spec (for CPU and memory per role) and the
    node, GPUs and ports of every task."""

    job_id: str
    spec: JobSpec
    tasks: tuple[TaskPlacement, ...]


@dataclass(frozen=True)
class NodeFree:
    """One node's free capacity. ``gpu_free`` is the free milli-GPU of each device by
    index (1000: nobody holds any of it). ``port_range`` is inclusive at both ends."""

    spec: NodeSpec
    cpu: float
    memory_mb: int
    gpu_free: tuple[int, ...]
    ports_taken: frozenset[int] = field(default_factory=frozenset)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def gpus(self) -> tuple[int, ...]:
        """Devices free as a whole: the only ones a whole-GPU task may take."""
        return tuple(i for i, free in enumerate(self.gpu_free) if free == MILLI)

    @property
    def best_share(self) -> int:
        """The most milli-GPU free on any one device: the largest share that fits."""
        return max(self.gpu_free, default=0)

    def state(self) -> NodeState:
        """The node as the scorers see it (integers: milli-CPU, MiB, milli-GPU)."""
        spec = self.spec
        return NodeState(
            model=spec.gpu_type.lower() if spec.gpu_type and spec.gpus else None,
            # Rounded: CPU is a float in cores, and 0.3 - 0.1 - 0.1 must still hold 0.1.
            cpu_milli=round(self.cpu * MILLI),
            memory_mib=self.memory_mb,
            gpu_free=self.gpu_free,
            cpu_capacity=round(spec.cpu * MILLI),
            memory_capacity=spec.memory_mb,
        )

    def port_free(self, port: int) -> bool:
        return port not in self.ports_taken

    def dynamic_ports_free(self, also_taken: frozenset[int] = frozenset()) -> int:
        lo, hi = self.spec.port_range
        taken = sum(1 for p in self.ports_taken | also_taken if lo <= p <= hi)
        return max(hi - lo + 1 - taken, 0)

    def take(
        self,
        cpu: float,
        memory_mb: int,
        gpus: Iterable[tuple[int, int]],
        ports: Iterable[int],
    ) -> NodeFree:
        """The node less a usage; ``gpus`` are (device index, milli-GPU) pairs."""
        free = list(self.gpu_free)
        for index, milli in gpus:
            if 0 <= index < len(free):
                # A stored allocation may name a device a changed cluster file no longer
                # has, or hold more than is left after such a change: never below zero.
                free[index] = max(free[index] - milli, 0)
        return replace(
            self,
            cpu=self.cpu - cpu,
            memory_mb=self.memory_mb - memory_mb,
            gpu_free=tuple(free),
            ports_taken=self.ports_taken | frozenset(ports),
        )


def task_gpus(task: TaskPlacement) -> list[tuple[int, int]]:
    """(device, milli-GPU) a placed task holds; placements stored before shares existed
    have no ``gpu_milli`` and held whole devices."""
    milli = task.gpu_milli if task.gpu_milli is not None else MILLI
    return [(index, milli) for index in task.gpu_indices]


def task_ports(task: TaskPlacement) -> list[int]:
    return [port for group in task.ports for port in group.ports]


class Snapshot:
    """Free capacity of every node, in the cluster's node order (first-fit follows it)."""

    def __init__(self, nodes: Iterable[NodeFree]) -> None:
        self._nodes = {node.name: node for node in nodes}

    @classmethod
    def of(cls, cluster: ClusterSpec, allocations: Iterable[Allocation] = ()) -> Snapshot:
        empty = cls(
            NodeFree(spec=n, cpu=n.cpu, memory_mb=n.memory_mb, gpu_free=(MILLI,) * n.gpus)
            for n in cluster.nodes
        )
        return empty.with_allocations(allocations)

    @property
    def nodes(self) -> tuple[NodeFree, ...]:
        return tuple(self._nodes.values())

    def node(self, name: str) -> NodeFree:
        return self._nodes[name]

    def with_allocation(self, allocation: Allocation) -> Snapshot:
        return self.with_allocations([allocation])

    def with_allocations(self, allocations: Iterable[Allocation]) -> Snapshot:
        # Usage is summed per node first and subtracted once, so deriving a snapshot
        # from many allocations costs one pass, not one node copy per task.
        used: dict[str, _Usage] = {}
        for allocation in allocations:
            for task in allocation.tasks:
                if task.node not in self._nodes:
                    # A node removed from the cluster file while a job ran on it: its
                    # capacity is gone anyway, nothing to subtract from.
                    continue
                resources = allocation.spec.role(task.role).resources
                usage = used.setdefault(task.node, _Usage())
                usage.cpu += resources.cpu
                usage.memory_mb += resources.memory_mb
                usage.gpus.extend(task_gpus(task))
                usage.ports.extend(task_ports(task))
        nodes = dict(self._nodes)
        for name, usage in used.items():
            nodes[name] = nodes[name].take(usage.cpu, usage.memory_mb, usage.gpus, usage.ports)
        snapshot = Snapshot(())
        snapshot._nodes = nodes
        return snapshot


@dataclass
class _Usage:
    cpu: float = 0.0
    memory_mb: int = 0
    gpus: list[tuple[int, int]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
