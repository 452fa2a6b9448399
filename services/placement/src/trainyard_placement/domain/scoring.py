"""The extension point for placement policies, and the fragmentation measure they share.

A policy is a :class:`Scorer`: for one task and one node that can hold it, a number (higher
is better) and the GPU devices it would take there. The gang placer and the trace
benchmark both ask every feasible node for its score and take the best, so a policy is
written once and measured on the same code that schedules.

Fragmentation follows Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC '23), section 3: a node's
free GPU milli counts as fragmented *for a task* when that task cannot use it (the node
cannot hold the task at all, or, when it can, the devices with less free milli than the
task asks per device). A node's fragmentation is the expectation over the *target
workload*, the distribution of typical tasks, so it is measured in milli-GPU.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from .gpu_share import MILLI, Demand, NodeState

# The FGD simulator normalises best-fit and dot-product by the largest node spec of the
# Alibaba cluster (128 cores, 8 GPUs); a cluster's own largest node is used when bigger.
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8 * MILLI
# The paper's simulator takes the most frequent task shapes until they cover 95 % of the
# tasks, and renormalises their frequencies.
TYPICAL_COVERAGE = 0.95


@dataclass(frozen=True, slots=True)
class Typical:
    """One task shape of the target workload and its share of the tasks."""

    demand: Demand
    freq: float


@dataclass
class ClusterContext:
    """What a scorer may know beyond the node and the task: the target workload, the
    normalisation spec and a seeded random source (random policies only)."""

    workload: tuple[Typical, ...] = ()
    max_cpu_milli: int = MAX_SPEC_CPU_MILLI
    max_gpu_milli: int = MAX_SPEC_GPU_MILLI
    rng: random.Random = field(default_factory=lambda: random.Random(0))


class Scorer(Protocol):
    """A placement policy. ``score`` is called only for nodes where ``fits`` holds;
    higher is better, and ties go to the node met first (cluster order). ``deterministic``
    says the score is a function of (node, demand, context.workload) alone, so a caller
    may cache it."""

    name: str
    deterministic: bool

    def score(self, node: NodeState, demand: Demand, ctx: ClusterContext) -> float: ...

    def devices(self, node: NodeState, demand: Demand, ctx: ClusterContext) -> tuple[int, ...]: ...


def typical_workload(
    demands: Iterable[Demand], coverage: float = TYPICAL_COVERAGE
) -> tuple[Typical, ...]:
    """The most frequent task shapes covering ``coverage`` of the tasks, frequencies
    renormalised to sum to 1. A shape is (CPU, GPUs, milli per GPU, models), as in the
    paper; the memory it carries is the mean over its tasks (the paper's measure ignores
    it, Trainyard's counts it)."""
    counts: Counter[Demand] = Counter()
    memory: Counter[Demand] = Counter()
    for d in demands:
        shape = Demand(d.cpu_milli, 0, d.gpu_count, d.gpu_milli, d.gpu_models)
        counts[shape] += 1
        memory[shape] += d.memory_mib
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(
        counts.items(),
        key=lambda kv: (-kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].gpu_count,
                        sorted(kv[0].gpu_models)),
    )  # fmt: skip
    chosen: list[tuple[Demand, int]] = []
    covered = 0
    for shape, count in ranked:
        chosen.append((replace(shape, memory_mib=memory[shape] // count), count))
        covered += count
        if covered >= coverage * total:
            break
    return tuple(Typical(demand, count / covered) for demand, count in chosen)


def fragmentation(node: NodeState, workload: Sequence[Typical]) -> float:
    """Expected fragmented milli-GPU of ``node`` for a task drawn from ``workload``
    (the paper's F_n(M)). CPU-only tasks count all free GPU milli: they cannot use it."""
    free = node.gpu_free
    total = sum(free)
    if not total:
        return 0.0
    frag = 0.0
    for typical in workload:
        d = typical.demand
        if (
            not d.gpu_count
            or node.cpu_milli < d.cpu_milli
            or (d.gpu_models and node.model not in d.gpu_models)
        ):
            frag += typical.freq * total
            continue
        usable = 0
        unusable = 0
        for f in free:
            if f >= d.gpu_milli:
                usable += 1
            else:
                unusable += f
        frag += typical.freq * (unusable if usable >= d.gpu_count else total)
    return frag


def stranded(node: NodeState, workload: Sequence[Typical]) -> float:
    """Trainyard's measure: the expected free milli-GPU of ``node`` that tasks drawn from
    ``workload`` could NOT take if that shape kept arriving. Where the paper counts every
    device with room for one task as usable, this counts what k tasks of the shape would
    take, k limited by the node's devices, CPU and memory together: four free GPUs beside
    CPU for one task are three stranded GPUs, and 1000 milli free hold two 460-milli
    shares, leaving 80."""
    free = node.gpu_free
    total = sum(free)
    if not total:
        return 0.0
    frag = 0.0
    for typical in workload:
        d = typical.demand
        if (
            not d.gpu_count
            or node.cpu_milli < d.cpu_milli
            or node.memory_mib < d.memory_mib
            or (d.gpu_models and node.model not in d.gpu_models)
        ):
            frag += typical.freq * total
            continue
        if d.is_share:
            slots = sum(f // d.gpu_milli for f in free)
        else:
            slots = sum(1 for f in free if f == MILLI) // d.gpu_count
        if d.cpu_milli:
            slots = min(slots, node.cpu_milli // d.cpu_milli)
        if d.memory_mib:
            slots = min(slots, node.memory_mib // d.memory_mib)
        frag += typical.freq * (total - slots * d.total_gpu_milli)
    return frag
