"""The launcher's service layer: launch and stop jobs, watch their tasks, end them once.

One consumer ("launcher") feeds ``EVENT_HANDLERS``; a watcher worker polls running
tasks. Both take the job's lock (one process, one event loop), so a job is never
launched, stopped and finished at the same time here; the store's conditional updates
keep it right across redeliveries and restarts. Every task transition is stored first,
then published with ``derived_id(job, attempt, role, index, seq)``; the job's end is
stored as a verdict first, then published as JobFinished with
``derived_id(job, attempt, "finished")``, the id placement uses too. A failed attempt
that runs again (domain/failure.py) stores its retry with the verdict and publishes
JobRetrying with ``derived_id(job, attempt, "retry")`` instead; placement re-queues the
job and a JobPlaced of the next attempt starts it here.

By concern: ``common`` (dependencies, events built from records, storing then
publishing a transition), ``launching``, ``ending`` (a task's end, the completion rules,
the verdict, clean-up), ``control`` (stop and interrupts), ``watching`` (the watcher and
adoption). This module holds the handler table the consumer's subscription is derived
from.
"""

from __future__ import annotations

from trainyard_common.bus import Delivery, EventHandler
from trainyard_common.events import Event, InterruptJob, JobPlaced, StopJob, TasksPlaced
from trainyard_common.subjects import subjects_for

from .common import (
    LOST,
    LOST_WHILE_DOWN,
    LOST_WHILE_STARTING,
    STOPPED_BEFORE_START,
    Deps,
    attempt_of,
    end_event,
    finished_event,
    handle_of,
    interrupted_event,
    publish_pending,
    record,
    retrying_event,
    task_event,
    task_full_env,
    task_launch,
    task_ref,
)
from .control import (
    interrupt_job,
    stop_job,
)
from .ending import (
    attempt_end,
    clean_up,
    end_task,
    evaluate_job,
    failure_of,
    finish_job,
    finish_with,
    kept_for_debug,
)
from .launching import (
    launch_job,
    launch_more,
    placement_of,
    start_task,
)
from .watching import (
    adopt,
    check_deadlines,
    check_start_deadlines,
    check_tasks,
    watch_tasks,
)

EVENT_HANDLERS: dict[type[Event], EventHandler[Deps]] = {
    JobPlaced: launch_job,
    TasksPlaced: launch_more,
    StopJob: stop_job,
    InterruptJob: interrupt_job,
}
# The consumer's subscription: exactly what the table handles.
SUBJECTS = subjects_for(EVENT_HANDLERS)


async def dispatch(deps: Deps, event: Event, delivery: Delivery) -> None:
    handler = EVENT_HANDLERS.get(type(event))
    if handler is not None:
        await handler(event, delivery, deps)


__all__ = [
    "Deps",
    "EVENT_HANDLERS",
    "LOST",
    "LOST_WHILE_DOWN",
    "LOST_WHILE_STARTING",
    "STOPPED_BEFORE_START",
    "SUBJECTS",
    "failure_of",
    "finish_with",
    "kept_for_debug",
    "placement_of",
    "adopt",
    "attempt_end",
    "attempt_of",
    "check_deadlines",
    "check_start_deadlines",
    "check_tasks",
    "clean_up",
    "dispatch",
    "end_event",
    "end_task",
    "evaluate_job",
    "finish_job",
    "finished_event",
    "handle_of",
    "interrupt_job",
    "interrupted_event",
    "launch_job",
    "publish_pending",
    "record",
    "retrying_event",
    "start_task",
    "stop_job",
    "task_event",
    "task_full_env",
    "task_launch",
    "task_ref",
    "watch_tasks",
]
