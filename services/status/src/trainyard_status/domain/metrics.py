"""What each event adds to the job metrics status exports (docs/observability.md): pure,
from the event and the job's view as it was before the event. The adapter
(adapters/metrics.py) applies them to Prometheus's counters and histograms, once per
event: only an event new to the history is counted, so a redelivery counts nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard_common.dialects import BY_NAME
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRejected,
    JobRetrying,
    JobState,
    JobSubmitted,
    TaskStateChanged,
)

from .projection import job_rank

# The counters (their names are in adapters/metrics.py).
SUBMITTED = "submitted"
ACCEPTED = "accepted"
REJECTED = "rejected"
FINISHED = "finished"
TASK_EXITS = "task_exits"
RETRIES = "retries"
INTERRUPTIONS = "interruptions"
# The histogram of a job's wait, from its submission to its first placement.
FIRST_WAIT = "first_wait"

NONE = "none"
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Observation:
    metric: str
    labels: tuple[str, ...]
    value: float = 1.0


def dialect_label(name: Any) -> str:
    """A dialect's name as a label: one of the platform's, or ``other`` (a label's values
    stay bounded whatever a stored document holds)."""
    return name if name in BY_NAME or name == "native" else OTHER


def observations(event: Event, job: dict[str, Any] | None) -> list[Observation]:
    """What ``event`` adds; ``job`` is the job's view before it (None: not known yet)."""
    dialect = dialect_label((job or {}).get("dialect"))
    match event:
        case JobSubmitted():
            return [Observation(SUBMITTED, (dialect_label(event.dialect),))]
        case JobAccepted():
            return [Observation(ACCEPTED, (dialect,))]
        case JobRejected():
            return [Observation(REJECTED, (dialect,))]
        case JobFinished():
            return [Observation(FINISHED, (dialect, event.state.value.lower()))]
        case JobPlaced() if job and job.get("submitted_at") and first_placement(event, job):
            wait = (event.occurred_at - job["submitted_at"]).total_seconds()
            return [Observation(FIRST_WAIT, (event.spec.queue,), max(wait, 0.0))]
        case TaskStateChanged() if event.state.terminal:
            failure = event.failure_class.value if event.failure_class else NONE
            return [Observation(TASK_EXITS, (event.state.value.lower(), failure))]
        case JobRetrying():
            failure = event.failure_class.value if event.failure_class else NONE
            return [Observation(RETRIES, (failure,))]
        case JobInterrupted():
            return [Observation(INTERRUPTIONS, (event.cause.value,))]
    return []


# A placement ranks the job's spec (a ranked group: its ``spec_rank``, adapters/views.py)
# at its attempt's PLACED; the submission and the acceptance rank it below any of them.
FIRST_PLACED_RANK = job_rank(JobState.PLACED, 1)


def first_placement(event: JobPlaced, job: dict[str, Any]) -> bool:
    """Whether ``event`` is the job's first placement, whatever its attempt: a job
    paused while it waited, or submitted paused (T9k's runMode pause), is first placed
    as a later attempt. No placement of any attempt projected before it (``job``, the
    view before the event, holds the rank of the latest), so each job counts once
    even when its placements are projected out of order. A view from before the ranked
    groups says nothing of them: its first attempt's placement is the first."""
    rank = job.get("spec_rank")
    if rank is None:
        return event.attempt == 1
    return bool(rank < FIRST_PLACED_RANK)


# Which events need the job's view before them (the others are counted without a read).
NEEDS_JOB = (JobAccepted, JobRejected, JobFinished, JobPlaced)
