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

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


# What a node has lost for a target workload, in milli-GPU (lower is better).
Measure = Callable[[NodeState], float]
# GPU model -> how scarce it is for the tasks that name it (``model_scarcity``), in the
# models' order.
Scarcity = tuple[tuple[str, float], ...]


@dataclass
class ClusterContext:
    """What a scorer may know beyond the node and the task: the target workload, the
    normalisation spec and a seeded random source (random policies only)."""

    workload: tuple[Typical, ...] = ()
    # The same with the multi-GPU shapes the GPU demand needs as well, where the GPUs
    # run out before the CPU (``workload_by_gpus``); None: ``workload`` alone.
    workload_by_gpus: tuple[Typical, ...] | None = None
    # How scarce each GPU model is for the tasks naming it (``model_scarcity``).
    scarcity: Scarcity = ()
    max_cpu_milli: int = MAX_SPEC_CPU_MILLI
    max_gpu_milli: int = MAX_SPEC_GPU_MILLI
    rng: random.Random = field(default_factory=lambda: random.Random(0))


class Scorer(Protocol):
    """A placement policy. ``score`` is called only for nodes where ``fits`` holds;
    higher is better, and ties go to the node met first (cluster order). ``deterministic``
    says the score is a function of (node, demand, context.workload,
    context.workload_by_gpus, context.scarcity) alone, so a caller may cache it while
    those stay the same."""

    name: str
    deterministic: bool

    def score(self, node: NodeState, demand: Demand, ctx: ClusterContext) -> float: ...

    def devices(self, node: NodeState, demand: Demand, ctx: ClusterContext) -> tuple[int, ...]: ...


def typical_workload(
    demands: Iterable[Demand],
    coverage: float = TYPICAL_COVERAGE,
    *,
    gpu_coverage: float = 0.0,
) -> tuple[Typical, ...]:
    """The most frequent task shapes covering ``coverage`` of the tasks, frequencies
    renormalised to sum to 1. A shape is (CPU, GPUs, milli per GPU, models), as in the
    paper; the memory it carries is the mean over its tasks (the paper's measure ignores
    it, Trainyard's counts it).

    ``gpu_coverage``: then the multi-GPU shapes left out, most GPU demand first, until
    the shapes cover that share of the GPU demand as well (frequencies renormalised over
    all of them). Tasks of 4 or 8 GPUs are few by count and many by GPUs: the paper's
    workload can leave every one of them out, and a measure blind to them lets one-GPU
    tasks break every whole node they need (docs/placement.md, "Shapes by GPUs")."""
    return typical_of_counts(Counter(demands), coverage, gpu_coverage=gpu_coverage)


def target_workloads(
    counts: Mapping[Demand, int], cpu_milli: int, gpu_milli: int
) -> tuple[tuple[Typical, ...], tuple[Typical, ...] | None]:
    """``ClusterContext.workload`` and ``.workload_by_gpus`` for tasks counted by demand
    on a cluster of ``cpu_milli`` and ``gpu_milli``, from one count of their shapes: the
    typical workload, and the same with the multi-GPU shapes the GPU demand needs where
    the tasks ask at most the cluster's CPU per GPU (None where they ask more). There
    the CPU runs out before the GPUs, the large tasks fail for want of CPU whatever
    nodes are kept whole for them, and keeping nodes whole sends the one-GPU tasks to
    the nodes with the least CPU left (docs/placement.md, "Shapes by GPUs")."""
    ranked, memory = _ranked(counts)
    paper = _typical(ranked, memory, TYPICAL_COVERAGE)
    cpu = sum(count * shape[0] for shape, count in ranked)
    gpu = sum(count * shape[1] * shape[2] for shape, count in ranked)
    if not gpu or not gpu_milli or cpu * gpu_milli > gpu * cpu_milli:
        return paper, None
    return paper, _typical(ranked, memory, TYPICAL_COVERAGE, TYPICAL_COVERAGE)


def model_scarcity(counts: Mapping[Demand, int], gpus_by_model: Mapping[str, int]) -> Scarcity:
    """How scarce each GPU model is for the tasks that name it: the share of the GPU
    demand that must go to the model (a task naming several models counted evenly
    among those the cluster has) over the model's share of the cluster's GPUs, at most
    1; models no task names are left out. A model at 1 is asked for all its GPUs by
    the tasks that can run nowhere else, so each of its GPUs another task takes is one
    they lose (docs/placement.md, "Scarce GPU models")."""
    capacity = sum(gpus_by_model.values())
    demand = 0
    # The parts of each model's demand, added with fsum: correctly rounded, so the same
    # float whatever order the counts come in (the scheduler's counts and a fresh count
    # of the same tasks must give the same scarcity, to the bit).
    named: dict[str, list[float]] = {}
    for d, n in counts.items():
        asked = n * d.gpu_count * d.gpu_milli
        if n <= 0 or not asked:
            continue
        demand += asked
        models = [m for m in d.gpu_models if gpus_by_model.get(m)]
        for model in models:
            named.setdefault(model, []).append(asked / len(models))
    if not demand or not capacity:
        return ()
    return tuple(
        (model, min(1.0, (math.fsum(parts) / demand) / (gpus_by_model[model] / capacity)))
        for model, parts in sorted(named.items())
    )


def scarce_measure(measure: Measure, scarcity: Scarcity, weight: float = 1.0) -> Measure:
    """``measure`` plus, on a node of a scarce model, the milli-GPU taken there times the
    model's scarcity (and ``weight``): what the tasks that need the model are expected
    to lose. A task naming one model pays it on every node it may use; a task that
    could run elsewhere pays it only where it takes a scarce model's GPUs. (The same
    shift of the gradient is not quite neutral for the first: FGD's score is a sigmoid
    of the gradient in integer steps, so a shifted gradient falls where the steps are
    coarser and more of its nodes tie; a large task naming one scarce model mostly
    goes to the first node that fits. Taking the shift out of such tasks' scores moved
    13 develop mixes by −0.05 to +0.06 only; docs/placement.md.)"""
    weights = {model: weight * value for model, value in scarcity if value and weight}
    if not weights:
        return measure

    def scarce(node: NodeState) -> float:
        paid = weights.get(node.model) if node.model is not None else None
        if paid is None:
            return measure(node)
        return measure(node) + paid * (len(node.gpu_free) * MILLI - sum(node.gpu_free))

    return scarce


Shape = tuple[int, int, int, frozenset[str]]  # CPU, GPUs, milli per GPU, models


def typical_of_counts(
    counts: Mapping[Demand, int],
    coverage: float = TYPICAL_COVERAGE,
    *,
    gpu_coverage: float = 0.0,
) -> tuple[Typical, ...]:
    """:func:`typical_workload` of tasks given as how many have each demand, so the
    scheduler, which keeps those counts, never walks every task."""
    return _typical(*_ranked(counts), coverage, gpu_coverage)


def _ranked(counts: Mapping[Demand, int]) -> tuple[list[tuple[Shape, int]], Counter[Shape]]:
    """The tasks' shapes, most frequent first, with their counts; and their memory."""
    shape_counts: Counter[Shape] = Counter()
    memory: Counter[Shape] = Counter()
    for d, n in counts.items():
        if n <= 0:
            continue
        shape = (d.cpu_milli, d.gpu_count, d.gpu_milli, d.gpu_models)
        shape_counts[shape] += n
        memory[shape] += d.memory_mib * n
    ranked = sorted(
        shape_counts.items(),
        key=lambda kv: (-kv[1], kv[0][0], kv[0][2], kv[0][1], sorted(kv[0][3])),
    )
    return ranked, memory


def _typical(
    ranked: list[tuple[Shape, int]],
    memory: Counter[Shape],
    coverage: float,
    gpu_coverage: float = 0.0,
) -> tuple[Typical, ...]:
    total = sum(count for _, count in ranked)
    if not total:
        return ()
    chosen: list[tuple[Demand, int]] = []
    covered = 0
    for (cpu, gpus, milli, models), count in ranked:
        chosen.append((Demand(cpu, memory[cpu, gpus, milli, models] // count, gpus, milli, models),
                       count))  # fmt: skip
        covered += count
        if covered >= coverage * total:
            break
    if gpu_coverage:
        taken = {shape for shape, _ in ranked[: len(chosen)]}
        asked = sum(count * shape[1] * shape[2] for shape, count in ranked)
        held = sum(count * shape[1] * shape[2] for shape, count in ranked[: len(chosen)])
        left = sorted(
            ((shape, count) for shape, count in ranked if shape[1] >= 2 and shape not in taken),
            key=lambda kv: -kv[1] * kv[0][1] * kv[0][2],
        )  # stable: equal demands keep the count order
        for (cpu, gpus, milli, models), count in left:
            if held >= gpu_coverage * asked:
                break
            chosen.append((Demand(cpu, memory[cpu, gpus, milli, models] // count, gpus, milli,
                                  models), count))  # fmt: skip
            covered += count
            held += count * gpus * milli
    return tuple(Typical(demand, count / covered) for demand, count in chosen)


def fragmentation(node: NodeState, workload: Sequence[Typical]) -> float:
    """Expected fragmented milli-GPU of ``node`` for a task drawn from ``workload``
    (the paper's F_n(M)). CPU-only tasks count all free GPU milli: they cannot use it."""
    return fragmentation_measure(workload)(node)


def stranded(node: NodeState, workload: Sequence[Typical]) -> float:
    """Trainyard's measure: the expected free milli-GPU of ``node`` that tasks drawn from
    ``workload`` could NOT take if that shape kept arriving. Where the paper counts every
    device with room for one task as usable, this counts what k tasks of the shape would
    take, k limited by the node's devices, CPU and memory together: four free GPUs beside
    CPU for one task are three stranded GPUs, and 1000 milli free hold two 460-milli
    shares, leaving 80."""
    return stranded_measure(workload)(node)


def fragmentation_measure(workload: Sequence[Typical]) -> Measure:
    """``fragmentation`` against one workload, as a function of the node: the shapes are
    read once, and what depends only on the milli a shape asks per device is counted once
    per node. (The sum runs in workload order with the same terms, so the floats are
    the same as summing shape by shape.)"""
    shapes = tuple(
        (t.freq, t.demand.gpu_count, t.demand.cpu_milli, t.demand.gpu_models, t.demand.gpu_milli)
        for t in workload
    )

    def measure(node: NodeState) -> float:
        free = node.gpu_free
        total = sum(free)
        if not total:
            return 0.0
        cpu, model = node.cpu_milli, node.model
        # milli asked per device -> (devices with that much free, milli on the others)
        split: dict[int, tuple[int, int]] = {}
        frag = 0.0
        for freq, count, cpu_milli, models, milli in shapes:
            if not count or cpu < cpu_milli or (models and model not in models):
                frag += freq * total
                continue
            found = split.get(milli)
            if found is None:
                found = split[milli] = _split(free, milli)
            frag += freq * (found[1] if found[0] >= count else total)
        return frag

    return measure


def _split(free: tuple[int, ...], milli: int) -> tuple[int, int]:
    """The devices with at least ``milli`` free, and the milli free on the others."""
    usable = unusable = 0
    for f in free:
        if f >= milli:
            usable += 1
        else:
            unusable += f
    return usable, unusable


def summed_measure(workload: Sequence[Typical], *, shares_only: bool = False) -> Measure:
    """``fragmentation`` over every shape plus ``stranded`` over the shapes of fewer than
    two GPUs. The paper's measure asks whether one task of a shape fits, the stranded one
    how many do; their sum weighs free milli on devices too full for a shape (both count
    it) twice, and GPUs that the node's CPU or memory leaves unusable once (only the
    stranded measure counts them). A multi-GPU shape counts in the paper's measure only:
    its stranded count would call the whole GPUs left over a multiple of its size lost,
    and those are what the one-GPU and sharing tasks take (docs/placement.md has what
    that cost on the develop mixes with more multi-GPU tasks). Both are summed in one
    pass over the shapes (the placer's hot path), each in the order of its own measure,
    so the result is ``fragmentation_measure(w)(node) + stranded_measure(single(w))(node)``
    to the bit, ``single`` keeping the shapes of fewer than two GPUs.

    ``shares_only``: the stranded part counts the sharing shapes (part of one GPU)
    alone, for workloads where multi-GPU tasks ask for most of the GPUs: there keeping
    whole GPUs together is what matters, which FGD's measure follows, and the stranded
    count of whole-GPU and CPU-only shapes packs partial nodes instead; the shares'
    count still fills devices already shared (docs/placement.md)."""
    return _stranded(workload, with_paper=True, shares_only=shares_only)


def stranded_measure(workload: Sequence[Typical]) -> Measure:
    """``stranded`` against one workload, as a function of the node (see
    ``fragmentation_measure``)."""
    return _stranded(workload, with_paper=False)


def _stranded(
    workload: Sequence[Typical], *, with_paper: bool, shares_only: bool = False
) -> Measure:
    def strands(demand: Demand) -> bool:
        """Whether the shape counts in the stranded part."""
        if not with_paper:
            return True
        return demand.is_share if shares_only else demand.gpu_count < 2

    shapes = tuple(
        (t.freq, t.demand.gpu_count, t.demand.cpu_milli, t.demand.memory_mib,
         t.demand.gpu_models, t.demand.gpu_milli,
         t.demand.gpu_milli if t.demand.is_share else 0, t.demand.total_gpu_milli,
         strands(t.demand))
        for t in workload
    )  # fmt: skip

    def measure(node: NodeState) -> float:
        free = node.gpu_free
        total = sum(free)
        if not total:
            return 0.0
        cpu, memory, model = node.cpu_milli, node.memory_mib, node.model
        whole = free.count(MILLI)
        split: dict[int, tuple[int, int]] = {}  # as in fragmentation_measure
        shares: dict[int, int] = {}  # milli of a share -> how many fit on the devices
        paper = frag = 0.0
        for freq, count, cpu_milli, memory_mib, models, milli, share, task_milli, strand in shapes:
            if not count or cpu < cpu_milli or (models and model not in models):
                paper += freq * total
                if strand:
                    frag += freq * total
                continue
            if with_paper:
                found = split.get(milli)
                if found is None:
                    found = split[milli] = _split(free, milli)
                paper += freq * (found[1] if found[0] >= count else total)
                if not strand:
                    continue
            if memory < memory_mib:
                frag += freq * total
                continue
            if share:
                slots = shares.get(share)
                if slots is None:
                    slots = 0
                    for f in free:
                        slots += f // share
                    shares[share] = slots
            else:
                slots = whole // count
            if cpu_milli and cpu // cpu_milli < slots:
                slots = cpu // cpu_milli
            if memory_mib and memory // memory_mib < slots:
                slots = memory // memory_mib
            frag += freq * (total - slots * task_milli)
        return paper + frag if with_paper else frag

    return measure
