"""Fractional GPUs: what one task asks of one node, and a node's free capacity per GPU.

Every GPU of a node has a free milli-capacity (1000 is a whole GPU). A task asking for a
fraction (0 < gpu < 1) takes that many milli-GPU on ONE device, which other fractional
tasks may share; a task asking for whole GPUs takes devices nobody holds any part of, so
a whole-GPU task never lands on a shared device. This is the model of the Alibaba trace
(cluster-trace-gpu-v2023) and of the FGD paper's simulator.

Everything here is integers (milli-CPU, MiB, milli-GPU), so the same functions serve the
scheduler and the trace benchmark, and equal states compare equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainyard_common.jobspec import Resources

MILLI = 1000


@dataclass(frozen=True, slots=True)
class Demand:
    """One task's request of one node. ``gpu_milli`` is per device: 1000 for whole GPUs,
    1-999 for a share (then ``gpu_count`` is 1), 0 without GPUs. ``gpu_models`` holds the
    allowed GPU models in lower case; empty means any model."""

    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = frozenset()
    _hash: int = field(init=False, repr=False, compare=False)

    # Demands and node states are the keys of the scorers' memos and of the placer's
    # groups, looked up millions of times a run: each hashes its fields once, when first
    # hashed (not when made: most demands the scheduler makes are never hashed).
    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            object.__setattr__(self, "_hash", hash(self._fields()))
            return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Made anew from its fields: string hashes differ between processes.
        return (type(self), self._fields())

    def _fields(self) -> tuple[Any, ...]:
        return (self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli, self.gpu_models)

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    @classmethod
    def of(cls, resources: Resources) -> Demand:
        count, milli = gpu_request(resources.gpu)
        # A model constraint binds only what the task holds: a task without GPUs goes
        # anywhere.
        models = frozenset(
            m.lower() for m in resources.allowed_gpu_types()
        ) if count else frozenset()  # fmt: skip
        return cls(
            cpu_milli=math.ceil(resources.cpu * MILLI - 1e-6),
            memory_mib=resources.memory_mb,
            gpu_count=count,
            gpu_milli=milli,
            gpu_models=models,
        )


def gpu_request(gpu: float) -> tuple[int, int]:
    """(devices, milli per device) for a task's ``gpu``: a fraction is a share of one
    device; anything from one up is whole devices, rounded up as before."""
    if gpu <= 0:
        return 0, 0
    milli = round(gpu * MILLI)
    if milli < MILLI:
        return 1, max(milli, 1)
    return math.ceil(gpu - 1e-9), MILLI


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's free capacity as the scorers see it. ``gpu_free`` is the free milli of each
    device, by device index. ``model`` is the GPU model in lower case."""

    model: str | None
    cpu_milli: int
    memory_mib: int
    gpu_free: tuple[int, ...]
    cpu_capacity: int
    memory_capacity: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __hash__(self) -> int:  # hashed once, as Demand
        try:
            return self._hash
        except AttributeError:
            object.__setattr__(self, "_hash", hash(self._fields()))
            return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._fields())

    def _fields(self) -> tuple[Any, ...]:
        return (self.model, self.cpu_milli, self.memory_mib, self.gpu_free,
                self.cpu_capacity, self.memory_capacity)  # fmt: skip

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free)

    @property
    def whole_free(self) -> int:
        return self.gpu_free.count(MILLI)


def model_allowed(demand: Demand, model: str | None) -> bool:
    if not demand.gpu_models:
        return True
    return model is not None and model in demand.gpu_models


def fits(node: NodeState, demand: Demand) -> bool:
    if node.cpu_milli < demand.cpu_milli or node.memory_mib < demand.memory_mib:
        return False
    return gpus_fit(node, demand)


def gpus_fit(node: NodeState, demand: Demand) -> bool:
    """The GPU part of ``fits``: the model, and one device with room for a share or
    enough untouched devices for whole GPUs."""
    if not demand.gpu_count:
        return True
    if not model_allowed(demand, node.model):
        return False
    if demand.is_share:
        return max(node.gpu_free, default=0) >= demand.gpu_milli
    return node.gpu_free.count(MILLI) >= demand.gpu_count


def share_candidates(node: NodeState, demand: Demand) -> list[int]:
    """Devices a share fits on, by index."""
    return [i for i, free in enumerate(node.gpu_free) if free >= demand.gpu_milli]


def whole_devices(node: NodeState, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-indexed devices nobody holds any part of."""
    picked = [i for i, free in enumerate(node.gpu_free) if free == MILLI][:count]
    return tuple(picked) if len(picked) == count else ()


def tightest_share(node: NodeState, demand: Demand) -> tuple[int, ...]:
    """Best-fit device for a share: the one left with the least free milli after it (a
    partly used device before an untouched one), lowest index on ties."""
    best = -1
    for i, free in enumerate(node.gpu_free):
        if free >= demand.gpu_milli and (best < 0 or free < node.gpu_free[best]):
            best = i
    return (best,) if best >= 0 else ()


def default_devices(node: NodeState, demand: Demand) -> tuple[int, ...]:
    if not demand.gpu_count:
        return ()
    if demand.is_share:
        return tightest_share(node, demand)
    return whole_devices(node, demand.gpu_count)


def take(node: NodeState, demand: Demand, devices: Sequence[int]) -> NodeState:
    """The node after ``demand`` is placed on it, holding ``devices``."""
    # Made directly, not with dataclasses.replace (several times slower): the scorers
    # call this for every node state they rate.
    return NodeState(
        node.model,
        node.cpu_milli - demand.cpu_milli,
        node.memory_mib - demand.memory_mib,
        _adjust(node.gpu_free, devices, -demand.gpu_milli),
        node.cpu_capacity,
        node.memory_capacity,
    )


def give_back(node: NodeState, demand: Demand, devices: Sequence[int]) -> NodeState:
    """The node after a task placed with ``take`` is released."""
    return NodeState(
        node.model,
        node.cpu_milli + demand.cpu_milli,
        node.memory_mib + demand.memory_mib,
        _adjust(node.gpu_free, devices, demand.gpu_milli),
        node.cpu_capacity,
        node.memory_capacity,
    )


def _adjust(free: tuple[int, ...], devices: Iterable[int], delta: int) -> tuple[int, ...]:
    out = list(free)
    for i in devices:
        out[i] += delta
        if not 0 <= out[i] <= MILLI:
            raise ValueError(f"GPU {i} would have {out[i]} milli free (of {MILLI})")
    return tuple(out)
