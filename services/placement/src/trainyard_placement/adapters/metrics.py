"""Placement's metrics (docs/observability.md): how long its cycles take and what they
decide, and, read from the leader's state at each scrape, the jobs waiting per queue and
the GPUs each queue holds on each node. A follower replica exports no state figures."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..domain.queue import QueuedJob
from ..domain.state import SchedulerState
from ..domain.usage import gpus_held, node_gpus, waiting_by_queue

CYCLE_SECONDS = Histogram(
    "trainyard_placement_cycle_seconds",
    "Time one scheduling cycle took (a walk of the queue: place, preempt, explain waits).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
DECISIONS = Counter(
    "trainyard_placement_decisions_total",
    "What cycles decided: placed (a job placed, whole or, without gang placement, with "
    "the tasks that fit), tasks_placed (more tasks of such a job placed) or preempted (a "
    "running job interrupted for a waiting one).",
    ["decision"],
)
# Each at 0 from the start: a series none was counted in yet does not exist, and an
# alert on its increase (deploy/prometheus/alerts.yml, TrainyardJobsStuck) could not
# fire before placement had placed something.
for _decision in ("placed", "tasks_placed", "preempted"):
    DECISIONS.labels(_decision)

Source = Callable[[], tuple[SchedulerState, Iterable[QueuedJob]] | None]


class SchedulerFigures(Collector):
    """Gauges computed from the scheduler's state when Prometheus scrapes (on the event
    loop's thread, like every change of that state)."""

    def __init__(self) -> None:
        self.source: Source = lambda: None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "trainyard_queue_waiting_jobs",
            "Jobs waiting to be placed in each queue (retries in their backoff included).",
            labels=["queue"],
        )
        held = GaugeMetricFamily(
            "trainyard_gpus_allocated",
            "GPUs the placed jobs of each queue hold on each node (a shared GPU counts "
            "its fraction).",
            labels=["node", "queue"],
        )
        total = GaugeMetricFamily(
            "trainyard_node_gpus", "GPUs each schedulable node has.", labels=["node"]
        )
        now = self.source()
        if now is not None:
            state, deferred = now
            for queue, count in sorted(waiting_by_queue(state, deferred).items()):
                waiting.add_metric([queue], count)
            for (node, queue), gpus in sorted(gpus_held(state).items()):
                held.add_metric([node, queue], gpus)
            for node, gpus in sorted(node_gpus(state).items()):
                total.add_metric([node], gpus)
        yield from (waiting, held, total)


FIGURES = SchedulerFigures()
REGISTRY.register(FIGURES)
