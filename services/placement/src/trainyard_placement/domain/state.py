"""The scheduler's state: queued jobs and the allocations of placed jobs.

Free capacity is never stored here; :meth:`SchedulerState.snapshot` derives it from the
allocations each time, so releasing a job is only forgetting its allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainyard_common.cluster import ClusterSpec

from .capacity import Allocation, Snapshot
from .queue import Decision, QueuedJob, schedule


@dataclass
class SchedulerState:
    cluster: ClusterSpec
    queued: dict[str, QueuedJob] = field(default_factory=dict)
    placed: dict[str, Allocation] = field(default_factory=dict)

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
        return schedule(self.queued.values(), self.snapshot())
