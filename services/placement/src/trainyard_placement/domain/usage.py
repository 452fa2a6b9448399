"""Figures of the scheduler's state for its metrics (docs/observability.md): pure reads
of what is queued and placed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .queue import QueuedJob
from .state import SchedulerState


def gpus_held(state: SchedulerState) -> dict[tuple[str, str], float]:
    """GPUs each queue's placed jobs hold on each node: (node, queue) -> GPUs, a share
    of a GPU counted as its fraction (500 milli-GPU: 0.5)."""
    held: dict[tuple[str, str], float] = {}
    for allocation in state.placed.values():
        queue = allocation.spec.queue
        for task in allocation.tasks:
            gpus = task.gpu_milli / 1000 if task.gpu_milli is not None else len(task.gpu_indices)
            if gpus:
                held[(task.node, queue)] = held.get((task.node, queue), 0.0) + gpus
    return held


def waiting_by_queue(state: SchedulerState, deferred: Iterable[QueuedJob] = ()) -> dict[str, int]:
    """Jobs waiting in each queue (every configured queue, 0 when none): queued ones and
    retries waiting out their backoff (``deferred``: outside the queue until then)."""
    counts: Counter[str] = Counter({name: 0 for name in state.cluster.queue_names()})
    for job in (*state.queued.values(), *deferred):
        counts[job.spec.queue] += 1
    return dict(counts)


def node_gpus(state: SchedulerState) -> dict[str, int]:
    return {node.name: node.gpus for node in state.cluster.nodes}
