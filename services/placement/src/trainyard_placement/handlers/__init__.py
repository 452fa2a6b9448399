"""Placement's service layer: one handler per event or command, and the scheduling cycle.

Every handler is idempotent (docs/design/0001): a stored state change is a conditional
update, each published event has an id derived from its cause, and the effect is stored
before it is announced. Handling is serialized by one lock, so one cycle runs at a time
and the in-memory state always matches the store after each handler.

A failed attempt that runs again (JobRetrying from the launcher) gives its allocation
back and is queued as the next attempt; until its backoff ends (``not_before``) it waits
outside the scheduler's queue (``Deps.deferred``), so it holds no one up, and
``wake_retries`` runs a cycle when it is due.

By concern: ``common`` (dependencies, published ids, keeping memory and store as one),
``jobs`` (a job's own events), ``control`` (pause, resume, restart, scale, interrupts),
``cycle`` (the scheduling cycle), ``startup`` (loading, waking retries, the queue
view). This module holds the handler table the consumer's subscription is derived from.
"""

from __future__ import annotations

from trainyard_common.bus import Delivery, EventHandler
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobRejected,
    JobRetrying,
    PauseJob,
    RestartJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    StopJob,
    TaskStateChanged,
)
from trainyard_common.subjects import subjects_for

from .common import (
    FIRST_ATTEMPT,
    PAUSED_STOP,
    SUBMITTED_PAUSED,
    Deps,
    JobEnded,
    JobNotFound,
    Publisher,
    ScaleRefused,
    finished_id,
    interrupt_id,
    interrupt_placed,
    interrupted_id,
    note_trace,
    notice_key,
    placed_id,
    publish,
    queued_id,
)
from .control import (
    pause_job,
    release_interrupted,
    request_scale,
    restart_job,
    resume_job,
    scale_job,
    set_priority,
    stop_interrupted,
)
from .cycle import (
    SHUTDOWN_REASON,
    run_cycle,
    run_due_cycle,
    shut_down,
)
from .jobs import (
    forget_rejected,
    queue_job,
    release_job,
    release_task,
    retry_job,
    stop_job,
)
from .startup import (
    load,
    queue_view,
    start,
    wake_retries,
)

EVENT_HANDLERS: dict[type[Event], EventHandler[Deps]] = {
    JobAccepted: queue_job,
    JobRejected: forget_rejected,
    JobFinished: release_job,
    JobRetrying: retry_job,
    StopJob: stop_job,
    PauseJob: pause_job,
    ResumeJob: resume_job,
    ScaleJob: scale_job,
    SetPriority: set_priority,
    RestartJob: restart_job,
    JobInterrupted: release_interrupted,
    TaskStateChanged: release_task,
}
# The consumer's subscription: exactly what the table handles.
SUBJECTS = subjects_for(EVENT_HANDLERS)


async def handle(event: Event, delivery: Delivery, deps: Deps) -> None:
    handler = EVENT_HANDLERS.get(type(event))
    if handler is None:
        return
    async with deps.lock:
        note_trace(deps, event.job_id)
        deps.in_message = deps.defer_cycles
        try:
            await handler(event, delivery, deps)
            if deps.caught_up:
                deps.caught_up = False
                await run_cycle(deps)
        finally:
            deps.in_message = False


__all__ = [
    "publish",
    "SUBJECTS",
    "Deps",
    "EVENT_HANDLERS",
    "EventHandler",
    "FIRST_ATTEMPT",
    "JobEnded",
    "JobNotFound",
    "PAUSED_STOP",
    "Publisher",
    "SHUTDOWN_REASON",
    "SUBMITTED_PAUSED",
    "ScaleRefused",
    "finished_id",
    "handle",
    "interrupt_id",
    "interrupt_placed",
    "interrupted_id",
    "load",
    "notice_key",
    "pause_job",
    "placed_id",
    "forget_rejected",
    "queue_job",
    "queue_view",
    "queued_id",
    "release_interrupted",
    "release_job",
    "request_scale",
    "restart_job",
    "resume_job",
    "retry_job",
    "run_cycle",
    "run_due_cycle",
    "scale_job",
    "set_priority",
    "shut_down",
    "start",
    "stop_interrupted",
    "stop_job",
    "wake_retries",
]
