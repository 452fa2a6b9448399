"""Pause, resume, restart, scale and the interrupts they send (docs/lifecycle.md).

A placed attempt is interrupted by placement alone: it stores "interrupting" (keeping
the allocation) and sends InterruptJob; the launcher ends the tasks and answers with
JobInterrupted, which frees the capacity. Then the stored intent decides: a pause
waits in "paused", anything else queues the next attempt at once, with the same
retries_used. A job that was not placed is paused here, and placement announces its
JobInterrupted itself."""

from __future__ import annotations

import logging

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    InterruptCause,
    JobInterrupted,
    PauseJob,
    RestartJob,
    ResumeJob,
    ScaleJob,
    SetPriority,
    StopJob,
)
from trainyard_common.jobspec import JobSpec
from trainyard_common.lifecycle import PlacementState as P

from ..adapters.store import (
    JobRecord,
    JobStoreState,
    interrupting_fields,
    next_attempt_fields,
    next_spec_fields,
    paused_fields,
    restart_handled_fields,
    spec_fields,
    stop_reason_fields,
)
from ..domain.elastic import scale_problem, scaled
from .common import (
    PAUSED_STOP,
    Deps,
    JobEnded,
    JobNotFound,
    ScaleRefused,
    announce_paused,
    announce_stopped,
    catch_up,
    interrupt_placed,
    known_record,
    publish,
    reload_job,
    send_interrupt,
)
from .cycle import run_cycle

log = logging.getLogger("trainyard.placement")


async def pause_job(event: PauseJob, delivery: Delivery, deps: Deps) -> None:
    record = await known_record(deps, event.job_id)
    if record.state == P.QUEUED:
        if await deps.store.change(
            record.job_id, states=(P.QUEUED,), attempt=record.attempt, fields=paused_fields()
        ):
            await reload_job(deps, record.job_id)
            await announce_paused(deps, record.job_id, record.attempt, event.reason)
            await run_cycle(deps)
    elif record.state == P.PLACED:
        await interrupt_placed(deps, record, InterruptCause.PAUSED, event.reason)
    elif record.state == P.PAUSED and delivery.num_delivered > 1:
        # A redelivery after a crash between storing the pause and announcing it.
        await announce_paused(deps, record.job_id, record.attempt, event.reason)
    elif record.state == P.INTERRUPTING and record.interrupt is not None:
        if record.interrupt[0] != InterruptCause.PAUSED:
            # Already on its way out (preempted, scaled): it is paused once it is out.
            await deps.store.change(
                record.job_id,
                states=(P.INTERRUPTING,),
                attempt=record.attempt,
                fields=interrupting_fields(InterruptCause.PAUSED.value, event.reason),
            )
        else:
            # A redelivery after a crash between storing and sending: the same id again.
            await send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)


async def resume_job(event: ResumeJob, delivery: Delivery, deps: Deps) -> None:
    record = await known_record(deps, event.job_id)
    if (
        record.state == P.INTERRUPTING
        and record.interrupt is not None
        and (record.interrupt[0] == InterruptCause.PAUSED)
    ):
        raise TransientError(f"job {record.job_id} is still being paused; resuming it after")
    if record.state != P.PAUSED:
        return  # running, queued or ended: nothing to resume
    if await deps.store.change(
        record.job_id,
        states=(P.PAUSED,),
        attempt=record.attempt,
        fields=next_attempt_fields(record.attempt + 1),
    ):
        await reload_job(deps, record.job_id)
        await run_cycle(deps)


async def restart_job(event: RestartJob, delivery: Delivery, deps: Deps) -> None:
    """A user's restart: the attempt running now ends (cause restarted) and the next one
    is queued at once, spending no retry; a paused job is resumed; a queued one (not
    started yet) or one already leaving for another cause gets its fresh start anyway.
    The command's id is stored with its effect, so a redelivery can never restart the
    attempt that the restart itself started."""
    record = await known_record(deps, event.job_id)
    if record.state in (P.DONE, P.STOPPED_EARLY) or record.spec is None:
        log.info("restart of job %s asked for after it ended: nothing to restart", record.job_id)
        return
    if event.event_id in record.restarts:
        await _restart_again(deps, record, event)
        return
    handled = restart_handled_fields(record.restarts, event.event_id)
    if record.state == P.PLACED:
        await interrupt_placed(deps, record, InterruptCause.RESTARTED, event.reason, handled)
    elif record.state == P.PAUSED:
        if await deps.store.change(
            record.job_id,
            states=(P.PAUSED,),
            attempt=record.attempt,
            fields={**next_attempt_fields(record.attempt + 1), **handled},
        ):
            await reload_job(deps, record.job_id)
            await run_cycle(deps)
    elif (
        record.state == P.INTERRUPTING
        and record.interrupt is not None
        and (record.interrupt[0] == InterruptCause.PAUSED)
    ):
        # Once it is paused, the restart resumes it (as a resume would wait).
        raise TransientError(f"job {record.job_id} is still being paused; restarting it after")
    else:
        # queued: its next start is fresh already; interrupting (preempted, scaled, a
        # node removed): its next attempt is queued as soon as this one is out.
        await deps.store.change(
            record.job_id, states=(record.state,), attempt=record.attempt, fields=handled
        )


async def _restart_again(deps: Deps, record: JobRecord, event: RestartJob) -> None:
    """A RestartJob handled already, delivered again: finish what a failure between
    storing its effect and acting on it may have left undone, and nothing more."""
    if (
        record.state == P.INTERRUPTING
        and record.restarts[-1] == event.event_id
        and (record.interrupt is not None and record.interrupt[0] == InterruptCause.RESTARTED)
    ):
        # Stored, maybe not sent: the same InterruptJob id again.
        await send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)
    elif (
        record.state == P.QUEUED
        and record.job_id not in deps.state.queued
        and (record.job_id not in deps.deferred)
    ):
        # A resumed job whose store moved on while memory did not (a failed handler).
        await reload_job(deps, record.job_id)
        await run_cycle(deps)


async def scale_job(event: ScaleJob, delivery: Delivery, deps: Deps) -> None:
    record = await known_record(deps, event.job_id)
    if record.spec is None or record.state in (P.DONE, P.STOPPED_EARLY):
        return
    current = record.next_spec or record.spec
    problem = scale_problem(current, event.role, event.replicas)
    if problem is not None:
        # Checked at the HTTP door already; a command from elsewhere is dropped, said why.
        log.warning("scale of job %s refused: %s", record.job_id, problem.message)
        return
    target = scaled(current, event.role, event.replicas)
    reason = f"scaled by {event.requested_by}: role {event.role} to {event.replicas} replica(s)"
    if record.state in (P.QUEUED, P.PAUSED):
        if await deps.store.change(
            record.job_id,
            states=(record.state,),
            attempt=record.attempt,
            fields=spec_fields(target),
        ):
            await reload_job(deps, record.job_id)
            await run_cycle(deps)
    elif record.state == P.PLACED:
        if target == record.spec:
            return  # already at that size
        await interrupt_placed(
            deps, record, InterruptCause.SCALED, reason, next_spec_fields(target)
        )
    elif record.state == P.INTERRUPTING and record.interrupt is not None:
        # Its next attempt (or its pause) takes the new size.
        if target != record.next_spec:
            await deps.store.change(
                record.job_id,
                states=(P.INTERRUPTING,),
                attempt=record.attempt,
                fields=next_spec_fields(target),
            )
        else:
            await send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)


async def set_priority(event: SetPriority, delivery: Delivery, deps: Deps) -> None:
    """A new priority: kept on the job's spec (and on its next attempt's, when it is
    being interrupted), so its place in the queue and preemption's weighing follow it."""
    record = await known_record(deps, event.job_id)
    if record.spec is None or record.state in (P.DONE, P.STOPPED_EARLY):
        return
    fields: dict[str, str] = {}
    if record.spec.priority != event.priority:
        fields.update(spec_fields(record.spec.model_copy(update={"priority": event.priority})))
    if record.next_spec is not None and record.next_spec.priority != event.priority:
        fields.update(
            next_spec_fields(record.next_spec.model_copy(update={"priority": event.priority}))
        )
    if fields and await deps.store.change(
        record.job_id, states=(record.state,), attempt=record.attempt, fields=fields
    ):
        await reload_job(deps, record.job_id)
        await run_cycle(deps)


async def release_interrupted(event: JobInterrupted, delivery: Delivery, deps: Deps) -> None:
    """An attempt ended without failing: give its capacity back, then pause the job,
    stop it (a stop came meanwhile) or queue its next attempt, spending no retry."""
    record = await deps.store.get(event.job_id)
    if record is None:
        return
    if record.attempt == event.attempt and record.state in (P.PLACED, P.INTERRUPTING):
        await _end_interrupted(deps, record, event)
        await run_cycle(deps)
        return
    # Handled already (a redelivery): memory may not have followed the store, if the
    # handler failed after its write landed.
    await catch_up(deps, record)
    if record.attempt == event.attempt and record.state == P.DONE and record.stopped_in_queue:
        # A redelivery after a crash between storing the stop and announcing it.
        await announce_stopped(deps, record.job_id, record.attempt, record.stop_reason)
    elif (
        record.attempt == event.attempt + 1
        and record.state == P.PAUSED
        and (event.cause != InterruptCause.PAUSED)
    ):
        # Likewise for a job paused while it was on its way out for another cause.
        await announce_paused(deps, record.job_id, record.attempt, event.reason)


async def _end_interrupted(deps: Deps, record: JobRecord, event: JobInterrupted) -> None:
    job_id, attempt = record.job_id, record.attempt
    cause, reason = record.interrupt or (event.cause.value, event.reason)
    states: tuple[JobStoreState, ...] = (P.PLACED, P.INTERRUPTING)
    if record.stop_reason is not None:
        if await deps.store.change(
            job_id,
            states=states,
            attempt=attempt,
            fields={"state": P.DONE, "stopped_in_queue": True},
        ):
            await reload_job(deps, job_id)
            await announce_stopped(deps, job_id, attempt, record.stop_reason)
            return
    elif cause == InterruptCause.PAUSED and event.cause == InterruptCause.PAUSED:
        # The launcher's JobInterrupted already says PAUSED.
        await deps.store.change(
            job_id, states=states, attempt=attempt, fields=paused_fields(record.next_spec)
        )
    elif cause == InterruptCause.PAUSED:
        # Paused while it was leaving for another cause: paused as its next attempt,
        # which this service announces (the launcher's event said it would be queued).
        if await deps.store.change(
            job_id,
            states=states,
            attempt=attempt,
            fields={**paused_fields(record.next_spec), "attempt": attempt + 1},
        ):
            await reload_job(deps, job_id)
            await announce_paused(deps, job_id, attempt + 1, reason)
            return
    else:
        await deps.store.change(
            job_id,
            states=states,
            attempt=attempt,
            fields=next_attempt_fields(attempt + 1, record.next_spec),
        )
    await reload_job(deps, job_id)


async def stop_interrupted(event: StopJob, record: JobRecord, deps: Deps) -> None:
    """StopJob for a job that holds no running attempt: a paused job ends here; one
    being interrupted ends when its JobInterrupted comes (the launcher is ending it)."""
    if record.state == P.PAUSED:
        if await deps.store.change(
            record.job_id,
            states=(P.PAUSED,),
            attempt=record.attempt,
            fields={"state": P.DONE, "stopped_in_queue": True, **stop_reason_fields(PAUSED_STOP)},
        ):
            await announce_stopped(deps, record.job_id, record.attempt, PAUSED_STOP)
            await run_cycle(deps)
    elif record.state == P.INTERRUPTING:
        await deps.store.change(
            record.job_id,
            states=(P.INTERRUPTING,),
            attempt=record.attempt,
            fields=stop_reason_fields(event.reason),
        )


async def request_scale(
    job_id: str, role: str, replicas: int, identity: Identity, deps: Deps
) -> ScaleJob:
    """The HTTP side of a scale: check it against the job's spec here (so a bad request
    is told why at once), then publish ScaleJob for the consumer to apply."""
    record = await deps.store.get(job_id)
    spec: JobSpec | None = None if record is None else (record.next_spec or record.spec)
    # Someone else's job answers exactly like a missing one.
    if record is None or spec is None or not identity.can_see(spec.user):
        raise JobNotFound(job_id)
    if record.state in (P.DONE, P.STOPPED_EARLY):
        raise JobEnded(job_id)
    problem = scale_problem(spec, role, replicas)
    if problem is not None:
        raise ScaleRefused(problem)
    command = ScaleJob(job_id=job_id, requested_by=identity.user, role=role, replicas=replicas)
    await publish(deps, command)
    return command
