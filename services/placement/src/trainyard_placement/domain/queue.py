"""One scheduling pass over the queue.

The cycle, in order: (1) derive a snapshot from the placed jobs, (2) order the queue,
(3) try each job in turn as a gang, (4) commit a fitting plan to the snapshot the next
job sees, or (5) stop at the first job that does not fit and explain why every job is
still waiting. Strict FIFO within priority: a job never overtakes the head of the queue
(backfill that cannot delay the head is a later policy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainyard_common.jobspec import JobSpec

from .capacity import Allocation, Snapshot
from .gang import Unschedulable, place_gang
from .scoring import ClusterContext, Scorer


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    spec: JobSpec
    arrival_seq: int
    attempt: int = 1


@dataclass(frozen=True)
class Placed:
    job_id: str
    allocation: Allocation
    attempt: int = 1


@dataclass(frozen=True)
class Waiting:
    """A job left in the queue; ``position`` counts from 1 at the head."""

    job_id: str
    position: int
    reasons: tuple[str, ...]
    attempt: int = 1


Decision = Placed | Waiting


def queue_order(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
    """Higher priority first, then by arrival."""
    return sorted(queue, key=lambda job: (-job.spec.priority, job.arrival_seq, job.job_id))


def schedule(
    queue: Iterable[QueuedJob],
    snapshot: Snapshot,
    scorer: Scorer | None = None,
    context: ClusterContext | None = None,
) -> list[Decision]:
    decisions: list[Decision] = []
    head: str | None = None
    position = 0
    for job in queue_order(queue):
        if head is None:
            outcome = place_gang(
                job.spec, snapshot, job_id=job.job_id, scorer=scorer, context=context
            )
            if not isinstance(outcome, Unschedulable):
                allocation = Allocation(job.job_id, job.spec, outcome.tasks)
                snapshot = snapshot.with_allocation(allocation)
                decisions.append(Placed(job.job_id, allocation, job.attempt))
                continue
            head = job.job_id
            reasons = outcome.reasons
        else:
            reasons = (f"waiting behind job {head} at the head of the queue",)
        position += 1
        decisions.append(Waiting(job.job_id, position, reasons, job.attempt))
    return decisions
