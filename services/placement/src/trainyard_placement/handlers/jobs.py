"""A job's own events: accepted (queued, or paused as submitted), rejected, finished,
retried, and a stop."""

from __future__ import annotations

import logging

from trainyard_common.bus import Delivery
from trainyard_common.events import (
    JobAccepted,
    JobFinished,
    JobRejected,
    JobRetrying,
    StopJob,
    TaskStateChanged,
)
from trainyard_common.jobspec import RunMode
from trainyard_common.lifecycle import PlacementState as P

from ..adapters.store import (
    allocation_fields,
    requeued_fields,
)
from ..domain import Allocation, QueuedJob
from .common import (
    FIRST_ATTEMPT,
    SUBMITTED_PAUSED,
    Deps,
    announce_carried,
    announce_paused,
    announce_stopped,
    announce_stopped_in_queue,
    carried_fields,
    catch_up,
    forget_queued,
    reload_job,
)
from .control import stop_interrupted
from .cycle import run_cycle

log = logging.getLogger("trainyard.placement")


async def queue_job(event: JobAccepted, delivery: Delivery, deps: Deps) -> None:
    job = QueuedJob(event.job_id, event.spec, delivery.stream_seq, FIRST_ATTEMPT)
    # T9k runMode.pause (Kubeflow suspend): the job waits paused for a ResumeJob.
    paused = job.spec.run_mode == RunMode.PAUSE
    inserted = await deps.store.add_queued(
        job.job_id,
        attempt=job.attempt,
        arrival_seq=job.arrival_seq,
        spec=job.spec,
        state=P.PAUSED if paused else P.QUEUED,
    )
    if inserted and paused:
        await announce_paused(deps, job.job_id, job.attempt, SUBMITTED_PAUSED)
    elif inserted:
        deps.state.enqueue(job)
        deps.retries_used[job.job_id] = 0
    else:
        record = await deps.store.get(job.job_id)
        if record is not None and record.state == P.PAUSED and record.attempt == FIRST_ATTEMPT:
            await announce_paused(deps, job.job_id, job.attempt, SUBMITTED_PAUSED)
        if record is not None and record.state == P.STOPPED_EARLY:
            await announce_stopped(
                deps, record.job_id, record.attempt, "stopped before it was placed"
            )
            await deps.store.mark_done(record.job_id, P.STOPPED_EARLY)
        elif record is not None:
            # A redelivery: the job is known in the store, and memory catches up if the
            # insert landed but its answer was lost (the store went away).
            await catch_up(deps, record)
    await run_cycle(deps)


async def forget_rejected(event: JobRejected, delivery: Delivery, deps: Deps) -> None:
    """A job validation rejected never comes: it is recorded as ended, so that a user's
    command taken before the rejection (handlers/common.py ``known_record``) finds it
    ended rather than waiting for it. A stop that came first is ended the same way."""
    await deps.store.add_tombstone(event.job_id, attempt=FIRST_ATTEMPT)
    await deps.store.mark_done(event.job_id, P.STOPPED_EARLY)


async def release_job(event: JobFinished, delivery: Delivery, deps: Deps) -> None:
    record = await deps.store.get(event.job_id)
    if record is None or record.attempt != event.attempt:
        return
    if record.state in (P.PLACED, P.INTERRUPTING):
        # An attempt being interrupted may end on its own first: its end wins.
        await deps.store.mark_done(record.job_id, record.state)
        deps.state.release(record.job_id)
        deps.unannounced.discard(record.job_id)
    elif record.state == P.QUEUED:
        # Ended before it was placed (stopped elsewhere): it must leave the queue.
        await deps.store.mark_done(record.job_id, P.QUEUED)
        forget_queued(deps, record.job_id)
    elif record.state == P.DONE:
        # A redelivery after the store marked it done but before memory let it go (the
        # answer was lost): let go now, or its capacity would stay taken.
        if record.job_id not in deps.state.placed and record.job_id not in deps.state.queued:
            return
        deps.state.release(record.job_id)
        deps.unannounced.discard(record.job_id)
        forget_queued(deps, record.job_id)
    else:
        return
    await run_cycle(deps)


async def release_task(event: TaskStateChanged, delivery: Delivery, deps: Deps) -> None:
    """A task of a job placed without gang placement ended: its capacity goes back now,
    while the job goes on (its last task's goes back with the job's end). Every other
    job's task events are passed over without a read."""
    job_id = event.job_id
    spec = deps.ungang.get(job_id)
    if spec is None or not event.state.terminal or job_id in deps.state.interrupting:
        return
    allocation = deps.state.placed.get(job_id)
    if allocation is None or deps.attempts.get(job_id) != event.attempt:
        return
    key = (event.role, event.index)
    tasks = tuple(t for t in allocation.tasks if (t.role, t.index) != key)
    if len(tasks) == len(allocation.tasks) or not tasks:
        return
    released = deps.released.get(job_id, frozenset()) | {key}
    if not await deps.store.change(
        job_id, states=(P.PLACED,), attempt=event.attempt, fields=allocation_fields(tasks, released)
    ):
        await reload_job(deps, job_id)
        return
    deps.released[job_id] = released
    deps.state.commit(Allocation(job_id, spec, tasks), placed_at=deps.state.placed_at.get(job_id))
    await run_cycle(deps)


async def stop_job(event: StopJob, delivery: Delivery, deps: Deps) -> None:
    record = await deps.store.get(event.job_id)
    if record is None:
        if await deps.store.add_tombstone(event.job_id, attempt=FIRST_ATTEMPT):
            return
        # JobAccepted was handled between our read and our insert; look again.
        record = await deps.store.get(event.job_id)
        if record is None:
            return
    if record.state == P.QUEUED:
        await deps.store.mark_done(record.job_id, P.QUEUED, stopped_in_queue=True)
        forget_queued(deps, record.job_id)
        await announce_stopped_in_queue(deps, record)
        await run_cycle(deps)
    elif record.state == P.DONE and record.stopped_in_queue:
        # A redelivery after a failure between storing the stop and announcing it (and
        # perhaps before memory forgot the job: it must not be placed).
        forget_queued(deps, record.job_id)
        await announce_stopped_in_queue(deps, record)
        await run_cycle(deps)
    elif record.state in (P.PAUSED, P.INTERRUPTING):
        await stop_interrupted(event, record, deps)


async def retry_job(event: JobRetrying, delivery: Delivery, deps: Deps) -> None:
    """The launcher gave up on an attempt and asks for the next: give the old
    allocation back and queue the job again, due at ``event.not_before``."""
    record = await deps.store.get(event.job_id)
    if record is None or record.attempt < event.previous_attempt:
        return
    if record.attempt == event.previous_attempt and record.state in (P.PLACED, P.INTERRUPTING):
        # One conditional update: the retry and whatever an interrupt under way meant for
        # it (a stop, a pause, a new size), so no crash can split them.
        fields = {
            **requeued_fields(event.attempt, event.not_before, record.retries_used + 1),
            **carried_fields(record),
        }
        if not await deps.store.change(
            record.job_id,
            states=(P.PLACED, P.INTERRUPTING),
            attempt=event.previous_attempt,
            fields=fields,
        ):
            log.warning(
                "job %s was not placed in attempt %d in the store; reloading it",
                record.job_id,
                event.previous_attempt,
            )
        await reload_job(deps, record.job_id)
        await announce_carried(deps, record, event.attempt)
    elif record.attempt == event.attempt:
        # A redelivery after the store moved on: memory, or an announcement, may not have.
        if record.state == P.QUEUED and (
            record.job_id not in deps.state.queued and record.job_id not in deps.deferred
        ):
            await reload_job(deps, record.job_id)
        elif record.state == P.DONE and record.stopped_in_queue:
            await announce_stopped(deps, record.job_id, record.attempt, record.stop_reason)
        elif record.state == P.PAUSED:
            await announce_paused(
                deps, record.job_id, record.attempt, "paused while its failed attempt was retried"
            )
    await run_cycle(deps)
