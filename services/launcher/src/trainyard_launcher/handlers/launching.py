"""Launching an attempt: its tasks recorded STARTING, then each spawned with its
environment, command and preparation."""

from __future__ import annotations

import dataclasses
import logging
import time

from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    JobPlaced,
    JobState,
    TaskPlacement,
    TasksPlaced,
    TaskState,
)
from trainyard_common.telemetry import current_traceparent

from ..adapters.backend import (
    AlreadyLaunched,
    LaunchError,
    LaunchRefused,
    PortUnavailable,
    TaskRef,
)
from ..adapters.store import (
    JOB_FINISHED,
    JOB_RUNNING,
    JOB_STOP_EARLY,
    JobRecord,
    TaskRecord,
    new_task,
    now_ms,
)
from ..domain.completion import Verdict
from ..domain.failure import EndKind
from ..domain.lifecycle import (
    DEBUG_REASON,
    is_debug,
)
from .common import (
    LOST_WHILE_STARTING,
    STOPPED_BEFORE_START,
    TRACER,
    Deps,
    attempt_of,
    publish_pending,
    record,
    task_attributes,
    task_launch,
    task_ref,
)
from .ending import evaluate_job, failure_of, finish_job, kept_for_debug

log = logging.getLogger("trainyard.launcher")


# --- launching ------------------------------------------------------------------------


async def launch_job(event: JobPlaced, delivery: Delivery, deps: Deps) -> None:
    async with deps.lock(event.job_id):
        job = await _job_for(event, deps)
        if job is None:
            return
        if job.state == JOB_FINISHED:
            if not job.finished_published:
                await finish_job(deps, job)
            return

        await _launch(deps, job, event.tasks)


async def launch_more(event: TasksPlaced, delivery: Delivery, deps: Deps) -> None:
    """Tasks of a running attempt placed after its start (a job without gang placement):
    each one not known here is recorded and started as JobPlaced's are."""
    async with deps.lock(event.job_id):
        job = await deps.store.get_job(event.job_id)
        if job is None or job.attempt < event.attempt:
            # Its JobPlaced is not handled yet (a redelivery comes after this one).
            raise TransientError(
                f"tasks placed for attempt {event.attempt} of {event.job_id}, not launched here"
            )
        if job.attempt > event.attempt or job.state != JOB_RUNNING:
            return  # the attempt ended: what it was given goes back with its end
        # New: without a task record (placements stored by a run that then died count).
        recorded = {(t.role, t.index) for t in await deps.store.tasks_of(job.job_id, job.attempt)}
        new = [p for p in event.tasks if (p.role, p.index) not in recorded]
        if not new:
            return
        known = {(p.role, p.index) for p in job.tasks}
        tasks = [*job.tasks, *(p for p in new if (p.role, p.index) not in known)]
        if len(tasks) > len(job.tasks) and not await deps.store.set_placements(
            job.job_id, job.attempt, tasks
        ):
            return  # it ended meanwhile
        await _launch(deps, dataclasses.replace(job, tasks=tasks), new)


async def _launch(deps: Deps, job: JobRecord, placements: list[TaskPlacement]) -> None:
    """Record each placed task STARTING, then start them, then judge the job. Until
    every one was started or ended, the attempt is the start deadline's to watch (what
    raised here, the message's redelivery tries again, for as long as the bus does)."""
    key = (job.job_id, job.attempt)
    deps.starting.add(key)
    await _record_and_start(deps, job, placements)
    deps.starting.discard(key)


async def _record_and_start(deps: Deps, job: JobRecord, placements: list[TaskPlacement]) -> None:
    assert job.spec is not None
    started: list[tuple[TaskRecord, TaskPlacement]] = []
    # Every task is recorded STARTING before any is spawned, so ending the job early (a
    # task that cannot start) finds and stops all of them.
    for placement in placements:
        ref = TaskRef(job.job_id, job.attempt, placement.role, placement.index)
        task = new_task(
            job.job_id,
            job.attempt,
            placement.role,
            placement.index,
            deps.backend.location(ref, job.spec),
            placement.node,
            traceparent=current_traceparent(),
        )
        if not await deps.store.insert_task(task):
            task = await deps.store.get_task(task.id) or task
        started.append((await publish_pending(deps, task), placement))
    if any(task.state == TaskState.STARTING for task, _ in started):
        # What the attempt's tasks share (a Service, an owner object) comes first.
        try:
            await deps.backend.open_attempt(attempt_of(job))
        except LaunchRefused as exc:
            # Never to be opened as asked (a namespace that cannot be one): each task
            # fails now, rather than the message coming back until it is dropped.
            for task, _ in started:
                if task.state == TaskState.STARTING:
                    await record(deps, task, TaskState.FAILED,
                                 reason=f"could not start: {exc}", ended_at=time.time(),
                                 **failure_of(EndKind.UNSUPPORTED))  # fmt: skip
            await evaluate_job(deps, job.job_id, job.attempt)
            return

    for task, placement in started:
        if task.state == TaskState.STARTING:
            task = await start_task(deps, job, task, placement) or task
        if task.state == TaskState.RUNNING:
            deps.watching[task.id] = task
        elif task.state == TaskState.FAILED and await evaluate_job(deps, job.job_id, job.attempt):
            return
    await evaluate_job(deps, job.job_id, job.attempt)


async def _job_for(event: JobPlaced, deps: Deps) -> JobRecord | None:
    """This attempt's job record, created or moved on as needed; None when the event is
    about an older attempt than the one here."""
    store = deps.store
    fresh = JobRecord(
        job_id=event.job_id,
        attempt=event.attempt,
        state=JOB_RUNNING,
        spec=event.spec,
        tasks=event.tasks,
        user=event.spec.user,
        retries_used=event.retries_used,
        placed_at=event.occurred_at,
    )
    job = await store.get_job(event.job_id)
    if job is None:
        if await store.insert_job(fresh):
            return fresh
        job = await store.get_job(event.job_id)
        assert job is not None
    if job.state == JOB_STOP_EARLY:
        stopped = dataclasses.replace(
            fresh, state=JOB_FINISHED, verdict=Verdict(JobState.STOPPED, STOPPED_BEFORE_START)
        )
        if await store.start_attempt(stopped, JOB_STOP_EARLY, job.attempt):
            return stopped
        return await store.get_job(event.job_id)
    if job.attempt > event.attempt:
        return None
    if job.attempt < event.attempt:
        if job.state != JOB_FINISHED:
            raise TransientError(
                f"attempt {event.attempt} of {event.job_id} placed while attempt "
                f"{job.attempt} still runs here"
            )
        if job.stop_reason is not None:
            # Stopped while it waited for this retry: the attempt ends before it starts.
            fresh = dataclasses.replace(
                fresh, state=JOB_FINISHED, verdict=Verdict(JobState.STOPPED, job.stop_reason)
            )
        if await store.start_attempt(fresh, JOB_FINISHED, job.attempt):
            return fresh
        return await store.get_job(event.job_id)
    return job


def placement_of(job: JobRecord, task: TaskRecord) -> TaskPlacement | None:
    return next((p for p in job.tasks if p.role == task.role and p.index == task.index), None)


async def start_task(
    deps: Deps, job: JobRecord, task: TaskRecord, placement: TaskPlacement | None
) -> TaskRecord | None:
    """STARTING → RUNNING (or FAILED); never spawns a task that was spawned before. A
    span of the job's trace, "task start", covers it."""
    with TRACER.start_as_current_span(
        "task start", attributes={**task_attributes(task), "trainyard.node": task.node or ""}
    ) as span:
        started = await _start_task(deps, job, task, placement)
        if started is not None:
            span.set_attribute("trainyard.task.state", started.state.value)
        return started


async def _start_task(
    deps: Deps, job: JobRecord, task: TaskRecord, placement: TaskPlacement | None
) -> TaskRecord | None:
    assert job.spec is not None
    ref = task_ref(task)
    launched = None
    if not await deps.backend.was_launched(ref):
        if placement is None:
            return await record(
                deps,
                task,
                TaskState.FAILED,
                reason="no placement for the task",
                ended_at=time.time(),
                **failure_of(EndKind.START_FAILED),
            )
        try:
            launched = await deps.backend.launch(task_launch(deps, job, ref, placement))
        except AlreadyLaunched:
            launched = None
        except LaunchRefused as exc:
            reason = await kept_for_debug(deps, job, task, f"could not start: {exc}")
            return await record(
                deps,
                task,
                TaskState.FAILED,
                reason=reason,
                ended_at=time.time(),
                **failure_of(EndKind.UNSUPPORTED),
            )
        except LaunchError as exc:
            kind = (
                EndKind.PORT_UNAVAILABLE
                if isinstance(exc, PortUnavailable)
                else EndKind.START_FAILED
            )
            return await record(
                deps,
                task,
                TaskState.FAILED,
                reason=f"could not start: {exc}",
                ended_at=time.time(),
                **failure_of(kind),
            )
    if launched is None:
        launched = await deps.backend.wait_started(ref, deps.start_wait_s)
        if launched is None:
            return await record(
                deps,
                task,
                TaskState.FAILED,
                reason=LOST_WHILE_STARTING,
                ended_at=time.time(),
                **failure_of(EndKind.LOST),
            )
    notes = [DEBUG_REASON] if is_debug(job.spec) else []
    notes += [launched.note] if launched.note else []
    return await record(
        deps,
        task,
        TaskState.RUNNING,
        pid=launched.handle.pid,
        start_ticks=launched.handle.start_ticks,
        uid=launched.handle.uid,
        started=now_ms(),
        reason="; ".join(notes) or None,
    )
