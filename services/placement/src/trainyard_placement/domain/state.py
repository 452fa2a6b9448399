"""The scheduler's state: queued jobs and the allocations of placed jobs.

Free capacity is never stored here; :meth:`SchedulerState.snapshot` derives it from the
allocations each time, so releasing a job is only forgetting its allocation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from trainyard_common.cluster import ClusterSpec

from .capacity import Allocation, Snapshot
from .gpu_share import MILLI, Demand
from .policies import scorer_named
from .queue import Decision, QueuedJob, schedule
from .scoring import (
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    ClusterContext,
    Scorer,
    typical_workload,
)


@dataclass
class SchedulerState:
    cluster: ClusterSpec
    queued: dict[str, QueuedJob] = field(default_factory=dict)
    placed: dict[str, Allocation] = field(default_factory=dict)
    # The placement policy (YARD_PLACEMENT_POLICY, chosen in bootstrap).
    scorer: Scorer = field(default_factory=lambda: scorer_named(None))

    def snapshot(self) -> Snapshot:
        return Snapshot.of(self.cluster, self.placed.values())

    def enqueue(self, job: QueuedJob) -> None:
        self.queued[job.job_id] = job

    def dequeue(self, job_id: str) -> QueuedJob | None:
        return self.queued.pop(job_id, None)

    def commit(self, allocation: Allocation) -> None:
        self.queued.pop(allocation.job_id, None)
        self.placed[allocation.job_id] = allocation

    def release(self, job_id: str) -> Allocation | None:
        return self.placed.pop(job_id, None)

    def cycle(self) -> list[Decision]:
        return schedule(self.queued.values(), self.snapshot(), self.scorer, self.context())

    def context(self) -> ClusterContext:
        """What fragmentation-aware policies measure against: the shapes of the tasks
        placed and waiting now stand for the target workload."""
        nodes = self.cluster.nodes
        return ClusterContext(
            workload=typical_workload(self._demands()),
            max_cpu_milli=max([MAX_SPEC_CPU_MILLI, *(round(n.cpu * MILLI) for n in nodes)]),
            max_gpu_milli=max([MAX_SPEC_GPU_MILLI, *(n.gpus * MILLI for n in nodes)]),
        )

    def _demands(self) -> Iterator[Demand]:
        specs = [a.spec for a in self.placed.values()] + [j.spec for j in self.queued.values()]
        for spec in specs:
            for role in spec.roles:
                demand = Demand.of(role.resources)
                for _ in range(role.replicas):
                    yield demand
