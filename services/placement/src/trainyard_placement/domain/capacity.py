"""What the cluster has free, derived from its nodes and the allocations of placed jobs.

Nothing here is a running counter: a :class:`Snapshot` is a function of the cluster and
the set of allocations, so dropping a job's allocation is all it takes to release it,
and a restart that reloads the same allocations sees exactly the same free capacity.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, TypeVar, overload

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


def gpu_type_matches(wanted: Sequence[str], node: NodeSpec) -> bool:
    """Whether the node's GPU model is one of ``wanted`` (any case); none wanted: any."""
    if not wanted:
        return True
    model = node.gpu_type.lower() if node.gpu_type else None
    return model is not None and any(model == w.lower() for w in wanted)


T = TypeVar("T")


class _cached(Generic[T]):  # noqa: N801 - used as a decorator, like cached_property
    """functools.cached_property without its lock (Python 3.11 takes one on every first
    read, a third of the cost of grouping a fresh snapshot's nodes). For the frozen
    NodeFree: a value computed from its fields, kept in its __dict__."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _cached[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | _cached[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


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

    # Cached: the placer's explanations read these for every node of the cluster.
    @_cached
    def gpus(self) -> tuple[int, ...]:
        """Devices free as a whole: the only ones a whole-GPU task may take."""
        return tuple(i for i, free in enumerate(self.gpu_free) if free == MILLI)

    @_cached
    def best_share(self) -> int:
        """The most milli-GPU free on any one device: the largest share that fits."""
        return max(self.gpu_free, default=0)

    def state(self) -> NodeState:
        """The node as the scorers see it (integers: milli-CPU, MiB, milli-GPU)."""
        return self._state

    @_cached
    def group_key(self) -> GroupKey:
        """What placement reads of a node besides its name, ports and labels: nodes with
        equal keys fit the same tasks and score the same (``Snapshot.groups``). The state
        and the exact free CPU; then, derived from the state for a fast fit check, the
        devices free as a whole and the most milli free on one device."""
        free = self.gpu_free
        return (self._state, self.cpu, free.count(MILLI), max(free, default=0))

    # Computed once per node value: the placer asks for it many times per decision, and a
    # NodeFree never changes (``take`` returns a new one, without the cache).
    @_cached
    def _state(self) -> NodeState:
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


def empty_node(spec: NodeSpec) -> NodeFree:
    """The node with nothing allocated."""
    return NodeFree(
        spec=spec, cpu=spec.cpu, memory_mb=spec.memory_mb, gpu_free=(MILLI,) * spec.gpus
    )


def task_gpus(task: TaskPlacement) -> list[tuple[int, int]]:
    """(device, milli-GPU) a placed task holds; placements stored before shares existed
    have no ``gpu_milli`` and held whole devices."""
    milli = task.gpu_milli if task.gpu_milli is not None else MILLI
    return [(index, milli) for index in task.gpu_indices]


def task_ports(task: TaskPlacement) -> list[int]:
    return [port for group in task.ports for port in group.ports]


GroupKey = tuple[NodeState, float, int, int]


class GpuIndex(NamedTuple):
    whole: Mapping[str | None, Mapping[int, Sequence[GroupKey]]]
    share: Mapping[str | None, Mapping[int, Sequence[GroupKey]]]


class Snapshot:
    """Free capacity of every node, in the cluster's node order (first-fit follows it)."""

    def __init__(self, nodes: Iterable[NodeFree]) -> None:
        self._nodes = {node.name: node for node in nodes}
        # Both derived on first use, then carried to the snapshots derived from this one.
        self._position: dict[str, int] | None = None
        self._groups: dict[GroupKey, list[str]] | None = None
        self._by_gpus: GpuIndex | None = None

    @classmethod
    def of(cls, cluster: ClusterSpec, allocations: Iterable[Allocation] = ()) -> Snapshot:
        empty = cls(empty_node(n) for n in cluster.nodes)
        return empty.with_allocations(allocations)

    @property
    def nodes(self) -> tuple[NodeFree, ...]:
        return tuple(self._nodes.values())

    def node(self, name: str) -> NodeFree:
        return self._nodes[name]

    def by_name(self) -> Mapping[str, NodeFree]:
        """Every node by name, in cluster order. Read-only."""
        return self._nodes

    def position(self, name: str) -> int:
        """The node's place in cluster order (0 first)."""
        return self.positions()[name]

    def positions(self) -> Mapping[str, int]:
        if self._position is None:
            self._position = {name: i for i, name in enumerate(self._nodes)}
        return self._position

    def groups(self) -> Mapping[GroupKey, Sequence[str]]:
        """The nodes grouped by ``NodeFree.group_key``, each group in cluster order. A
        placer that scores each group once instead of each node does the work of the
        cluster's distinct states, not of its size; the grouping is built once and then
        updated for the nodes each derived snapshot changes. Read-only."""
        if self._groups is None:
            # First by the fields the key is computed from, which is cheaper than
            # computing it for every node; then one key per such set of fields.
            by_fields: dict[tuple[Any, ...], list[str]] = {}
            for name, node in self._nodes.items():
                spec = node.spec
                fields = (node.cpu, node.memory_mb, node.gpu_free,
                          spec.gpu_type, spec.gpus, spec.cpu, spec.memory_mb)  # fmt: skip
                by_fields.setdefault(fields, []).append(name)
            groups: dict[GroupKey, list[str]] = {}
            position = self.positions()
            for names in by_fields.values():
                key = self._nodes[names[0]].group_key
                if key in groups:  # other fields, same key (a GPU type's case): merge
                    names = sorted(groups[key] + names, key=position.__getitem__)
                groups[key] = names
            self._groups = groups
        return self._groups

    def by_gpus(self) -> GpuIndex:
        """The groups' keys by GPU model (lower case; None: no GPUs) and then by devices
        free as a whole, and by the most milli free on one device: where a task asking
        for GPUs may fit, without looking at the groups that cannot hold it. Read-only."""
        if self._by_gpus is None:
            whole: dict[str | None, dict[int, list[GroupKey]]] = {}
            share: dict[str | None, dict[int, list[GroupKey]]] = {}
            for key in self.groups():
                model = key[0].model
                whole.setdefault(model, {}).setdefault(key[2], []).append(key)
                share.setdefault(model, {}).setdefault(key[3], []).append(key)
            self._by_gpus = GpuIndex(whole, share)
        return self._by_gpus

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
        return self._derived(nodes, used)

    def with_nodes(self, changed: Mapping[str, NodeFree]) -> Snapshot:
        """The same cluster with the ``changed`` nodes (all of them in this snapshot) in
        their new states: how the scheduler's state keeps its snapshot up to date when
        jobs come and go, instead of deriving it from every allocation."""
        nodes = dict(self._nodes)
        nodes.update(changed)
        return self._derived(nodes, changed)

    def _derived(self, nodes: dict[str, NodeFree], changed: Iterable[str]) -> Snapshot:
        snapshot = Snapshot(())
        snapshot._nodes = nodes
        snapshot._position = self._position
        if self._groups is not None:
            snapshot._groups = self._regrouped(nodes, changed)
        return snapshot

    def _regrouped(
        self, nodes: dict[str, NodeFree], changed: Iterable[str]
    ) -> dict[GroupKey, list[str]]:
        """This snapshot's groups with the ``changed`` nodes moved to their new keys. The
        lists are shared with this snapshot, so the ones that change are copied first."""
        assert self._groups is not None
        groups = dict(self._groups)
        copied: set[GroupKey] = set()
        position = self.positions()
        for name in changed:
            old, new = self._nodes[name].group_key, nodes[name].group_key
            if old == new:
                continue
            members = groups[old] if old in copied else list(groups[old])
            del members[bisect_left(members, position[name], key=position.__getitem__)]
            if members:
                groups[old] = members
                copied.add(old)
            else:
                del groups[old]
                copied.discard(old)
            members = groups[new] if new in copied else list(groups.get(new, ()))
            insort(members, name, key=position.__getitem__)
            groups[new] = members
            copied.add(new)
        return groups

    def where(self, keep: Callable[[NodeFree], bool]) -> Snapshot:
        """Only the nodes ``keep`` accepts, in the same order: what one role may use
        (node selectors, drained nodes; domain/eligible.py)."""
        return Snapshot(node for node in self._nodes.values() if keep(node))


@dataclass
class _Usage:
    cpu: float = 0.0
    memory_mb: int = 0
    gpus: list[tuple[int, int]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
