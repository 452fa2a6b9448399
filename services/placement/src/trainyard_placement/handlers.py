"""Placement's service layer: one handler per event or command, and the scheduling cycle.

Every handler is idempotent (docs/design/0001): a stored state change is a conditional
update, each published event has an id derived from its cause, and the effect is stored
before it is announced. Handling is serialized by one lock, so one cycle runs at a time
and the in-memory state always matches the store after each handler.

A failed attempt that runs again (JobRetrying from the launcher) gives its allocation
back and is queued as the next attempt; until its backoff ends (``not_before``) it waits
outside the scheduler's queue (``Deps.deferred``), so it holds no one up, and
``wake_retries`` runs a cycle when it is due.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    Event,
    InterruptCause,
    InterruptJob,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    JobRetrying,
    JobState,
    PauseJob,
    RestartJob,
    ResumeJob,
    ScaleJob,
    StopJob,
    derived_id,
    utcnow,
)
from trainyard_common.jobspec import JobSpec, RunMode

from .adapters.store import (
    ACTIVE_STATES,
    JobRecord,
    JobStore,
    JobStoreState,
    interrupt_sent_fields,
    interrupting_fields,
    next_attempt_fields,
    next_spec_fields,
    paused_fields,
    preempted_fields,
    requeued_fields,
    restart_handled_fields,
    spec_fields,
    stop_reason_fields,
)
from .domain import Allocation, Placed, Preempt, QueuedJob, SchedulerState, Waiting
from .domain.elastic import ScaleProblem, scale_problem, scaled
from .domain.growth import growth

log = logging.getLogger("trainyard.placement")

# Attempts are counted from 1; a retry (JobRetrying) queues the next one.
FIRST_ATTEMPT = 1
SUBMITTED_PAUSED = "submitted to start paused: waiting for a resume"
PAUSED_STOP = "stopped while paused"
# A command for a job not accepted yet waits for it this many deliveries (~40 s of nak
# delays), then is dropped: the job was rejected.
EARLY_COMMAND_DELIVERIES = 10


class Publisher(Protocol):
    async def publish(self, event: Event) -> Any: ...


@dataclass
class Deps:
    store: JobStore
    publisher: Publisher
    state: SchedulerState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Placed jobs whose JobPlaced is not known to be published yet.
    unannounced: set[str] = field(default_factory=set)
    # How many JobQueued each waiting job was sent, and the notice key of the last one.
    notices: dict[str, tuple[int, tuple[tuple[str, ...], int] | None]] = field(default_factory=dict)
    # The last cycle's verdict on each waiting job, for the queue view.
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # Retried jobs whose backoff has not ended: (job, not_before), outside the queue.
    deferred: dict[str, tuple[QueuedJob, datetime]] = field(default_factory=dict)
    # The attempt of each placed job (its JobPlaced carries it).
    attempts: dict[str, int] = field(default_factory=dict)
    # The retry budget each queued or placed job has spent (its JobPlaced carries it).
    retries_used: dict[str, int] = field(default_factory=dict)
    # Interrupted jobs whose InterruptJob a crash may have kept from going out.
    unsent_preemptions: set[str] = field(default_factory=set)
    # An elastic job grows only after running this long at its size, so capacity that
    # frees in bursts does not restart it again and again.
    growth_after_s: float = 30.0
    # The platform is shutting down: nothing more is placed by this process.
    draining: bool = False
    # What time it is (tests pass a clock they move instead of sleeping).
    clock: Callable[[], datetime] = utcnow


def finished_id(job_id: str, attempt: int) -> str:
    """The id of the one JobFinished of an attempt. The launcher derives its JobFinished
    id the same way, so a job stopped in the queue and one ended by the launcher can
    never both be announced for one attempt."""
    return derived_id(job_id, attempt, "finished")


def placed_id(job_id: str, attempt: int) -> str:
    return derived_id(job_id, attempt, "placed")


def queued_id(job_id: str, attempt: int, notice: int, reasons: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\n".join(reasons).encode()).hexdigest()[:16]
    return derived_id(job_id, attempt, "queued", notice, digest)


# --- handlers --------------------------------------------------------------------------


async def queue_job(event: JobAccepted, delivery: Delivery, deps: Deps) -> None:
    job = QueuedJob(event.job_id, event.spec, delivery.stream_seq, FIRST_ATTEMPT)
    # T9k runMode.pause (Kubeflow suspend): the job waits paused for a ResumeJob.
    paused = job.spec.run_mode == RunMode.PAUSE
    inserted = await deps.store.add_queued(
        job.job_id,
        attempt=job.attempt,
        arrival_seq=job.arrival_seq,
        spec=job.spec,
        state="paused" if paused else "queued",
    )
    if inserted and paused:
        await _announce_paused(deps, job.job_id, job.attempt, SUBMITTED_PAUSED)
    elif inserted:
        deps.state.enqueue(job)
        deps.retries_used[job.job_id] = 0
    else:
        record = await deps.store.get(job.job_id)
        if record is not None and record.state == "paused" and record.attempt == FIRST_ATTEMPT:
            await _announce_paused(deps, job.job_id, job.attempt, SUBMITTED_PAUSED)
        if record is not None and record.state == "stopped_early":
            await deps.publisher.publish(JobFinished(
                event_id=finished_id(record.job_id, record.attempt),
                job_id=record.job_id,
                attempt=record.attempt,
                state=JobState.STOPPED,
                reason="stopped before it was placed",
            ))  # fmt: skip
            await deps.store.mark_done(record.job_id, "stopped_early")
        # Otherwise a redelivery: the job is already known, in memory as in the store.
    await run_cycle(deps)


async def release_job(event: JobFinished, delivery: Delivery, deps: Deps) -> None:
    record = await deps.store.get(event.job_id)
    if record is None or record.attempt != event.attempt:
        return
    if record.state in ("placed", "interrupting"):
        # An attempt being interrupted may end on its own first: its end wins.
        await deps.store.mark_done(record.job_id, record.state)
        deps.state.release(record.job_id)
        deps.unannounced.discard(record.job_id)
    elif record.state == "queued":
        # Ended before it was placed (stopped elsewhere): it must leave the queue.
        await deps.store.mark_done(record.job_id, "queued")
        _forget_queued(deps, record.job_id)
    else:
        return
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
    if record.state == "queued":
        await deps.store.mark_done(record.job_id, "queued", stopped_in_queue=True)
        _forget_queued(deps, record.job_id)
        await _announce_stopped_in_queue(deps, record)
        await run_cycle(deps)
    elif record.state == "done" and record.stopped_in_queue:
        # A redelivery after a failure between storing the stop and announcing it.
        await _announce_stopped_in_queue(deps, record)
        await run_cycle(deps)
    elif record.state in ("paused", "interrupting"):
        await stop_interrupted(event, record, deps)
    # placed: the launcher stops it and announces JobFinished; stopped_early: a repeat.


async def retry_job(event: JobRetrying, delivery: Delivery, deps: Deps) -> None:
    """The launcher gave up on an attempt and asks for the next: give the old
    allocation back and queue the job again, due at ``event.not_before``."""
    record = await deps.store.get(event.job_id)
    if record is None or record.attempt < event.previous_attempt:
        return
    if record.attempt == event.previous_attempt and record.state in ("placed", "interrupting"):
        # One conditional update: the retry and whatever an interrupt under way meant for
        # it (a stop, a pause, a new size), so no crash can split them.
        fields = {
            **requeued_fields(event.attempt, event.not_before, record.retries_used + 1),
            **_carried(record),
        }
        if not await deps.store.change(
            record.job_id,
            states=("placed", "interrupting"),
            attempt=event.previous_attempt,
            fields=fields,
        ):
            log.warning(
                "job %s was not placed in attempt %d in the store; reloading it",
                record.job_id,
                event.previous_attempt,
            )
        await _reload(deps, record.job_id)
        await _announce_carried(deps, record, event.attempt)
    elif record.attempt == event.attempt:
        # A redelivery after the store moved on: memory, or an announcement, may not have.
        if record.state == "queued" and (
            record.job_id not in deps.state.queued and record.job_id not in deps.deferred
        ):
            await _reload(deps, record.job_id)
        elif record.state == "done" and record.stopped_in_queue:
            await _announce_stopped(deps, record.job_id, record.attempt, record.stop_reason)
        elif record.state == "paused":
            await _announce_paused(
                deps, record.job_id, record.attempt, "paused while its failed attempt was retried"
            )
    await run_cycle(deps)


# --- control: pause, resume, restart, scale and interrupts (docs/lifecycle.md) --------
#
# A placed attempt is interrupted by placement alone: it stores "interrupting" (keeping
# the allocation) and sends InterruptJob; the launcher ends the tasks and answers with
# JobInterrupted, which frees the capacity. Then the stored intent decides: a pause
# waits in "paused", anything else queues the next attempt at once, with the same
# retries_used. A job that was not placed is paused here, and placement announces its
# JobInterrupted itself.


class JobNotFound(LookupError):
    pass


class JobEnded(Exception):
    pass


class ScaleRefused(ValueError):
    def __init__(self, problem: ScaleProblem) -> None:
        super().__init__(problem.message)
        self.field = problem.field


def interrupt_id(job_id: str, attempt: int, cause: InterruptCause | str) -> str:
    return derived_id(job_id, attempt, "interrupt", InterruptCause(cause).value)


def interrupted_id(job_id: str, attempt: int) -> str:
    """The one JobInterrupted of an attempt, whichever service announces it."""
    return derived_id(job_id, attempt, "interrupted")


async def interrupt_placed(
    deps: Deps,
    record: JobRecord,
    cause: InterruptCause,
    reason: str,
    fields: dict[str, Any] | None = None,
) -> bool:
    """placed -> interrupting (plus ``fields``), then InterruptJob to the launcher. Call
    with the lock held; False when the store had moved on. The capacity stays taken
    until JobInterrupted (or the attempt's own end) arrives."""
    if record.job_id in deps.unannounced and record.job_id in deps.state.placed:
        # The launcher must know the attempt before it is told to end it.
        await _announce_placed(deps, deps.state.placed[record.job_id])
    changed = await deps.store.change(
        record.job_id,
        states=("placed",),
        attempt=record.attempt,
        fields={**interrupting_fields(cause.value, reason), **(fields or {})},
    )
    if changed:
        await _send_interrupt(deps, record.job_id, record.attempt, cause, reason)
    return changed


async def pause_job(event: PauseJob, delivery: Delivery, deps: Deps) -> None:
    record = await _known(deps, event.job_id, delivery)
    if record is None:
        return
    if record.state == "queued":
        if await deps.store.change(
            record.job_id, states=("queued",), attempt=record.attempt, fields=paused_fields()
        ):
            await _reload(deps, record.job_id)
            await _announce_paused(deps, record.job_id, record.attempt, event.reason)
            await run_cycle(deps)
    elif record.state == "placed":
        await interrupt_placed(deps, record, InterruptCause.PAUSED, event.reason)
    elif record.state == "paused" and delivery.num_delivered > 1:
        # A redelivery after a crash between storing the pause and announcing it.
        await _announce_paused(deps, record.job_id, record.attempt, event.reason)
    elif record.state == "interrupting" and record.interrupt is not None:
        if record.interrupt[0] != InterruptCause.PAUSED:
            # Already on its way out (preempted, scaled): it is paused once it is out.
            await deps.store.change(
                record.job_id,
                states=("interrupting",),
                attempt=record.attempt,
                fields=interrupting_fields(InterruptCause.PAUSED.value, event.reason),
            )
        else:
            # A redelivery after a crash between storing and sending: the same id again.
            await _send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)
    # paused (asked again), done, stopped_early: nothing to pause.


async def resume_job(event: ResumeJob, delivery: Delivery, deps: Deps) -> None:
    record = await _known(deps, event.job_id, delivery)
    if record is None:
        return
    if (
        record.state == "interrupting"
        and record.interrupt is not None
        and (record.interrupt[0] == InterruptCause.PAUSED)
    ):
        raise TransientError(f"job {record.job_id} is still being paused; resuming it after")
    if record.state != "paused":
        return  # running, queued or ended: nothing to resume
    if await deps.store.change(
        record.job_id,
        states=("paused",),
        attempt=record.attempt,
        fields=next_attempt_fields(record.attempt + 1),
    ):
        await _reload(deps, record.job_id)
        await run_cycle(deps)


async def restart_job(event: RestartJob, delivery: Delivery, deps: Deps) -> None:
    """A user's restart: the attempt running now ends (cause restarted) and the next one
    is queued at once, spending no retry; a paused job is resumed; a queued one (not
    started yet) or one already leaving for another cause gets its fresh start anyway.
    The command's id is stored with its effect, so a redelivery can never restart the
    attempt that the restart itself started."""
    record = await _known(deps, event.job_id, delivery)
    if record is None:
        return
    if record.state in ("done", "stopped_early") or record.spec is None:
        log.info("restart of job %s asked for after it ended: nothing to restart", record.job_id)
        return
    if event.event_id in record.restarts:
        await _restart_again(deps, record, event)
        return
    handled = restart_handled_fields(record.restarts, event.event_id)
    if record.state == "placed":
        await interrupt_placed(deps, record, InterruptCause.RESTARTED, event.reason, handled)
    elif record.state == "paused":
        if await deps.store.change(
            record.job_id,
            states=("paused",),
            attempt=record.attempt,
            fields={**next_attempt_fields(record.attempt + 1), **handled},
        ):
            await _reload(deps, record.job_id)
            await run_cycle(deps)
    elif (
        record.state == "interrupting"
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
        record.state == "interrupting"
        and record.restarts[-1] == event.event_id
        and (record.interrupt is not None and record.interrupt[0] == InterruptCause.RESTARTED)
    ):
        # Stored, maybe not sent: the same InterruptJob id again.
        await _send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)
    elif (
        record.state == "queued"
        and record.job_id not in deps.state.queued
        and (record.job_id not in deps.deferred)
    ):
        # A resumed job whose store moved on while memory did not (a failed handler).
        await _reload(deps, record.job_id)
        await run_cycle(deps)


async def scale_job(event: ScaleJob, delivery: Delivery, deps: Deps) -> None:
    record = await _known(deps, event.job_id, delivery)
    if record is None or record.spec is None or record.state in ("done", "stopped_early"):
        return
    current = record.next_spec or record.spec
    problem = scale_problem(current, event.role, event.replicas)
    if problem is not None:
        # Checked at the HTTP door already; a command from elsewhere is dropped, said why.
        log.warning("scale of job %s refused: %s", record.job_id, problem.message)
        return
    target = scaled(current, event.role, event.replicas)
    reason = f"scaled by {event.requested_by}: role {event.role} to {event.replicas} replica(s)"
    if record.state in ("queued", "paused"):
        if await deps.store.change(
            record.job_id,
            states=(record.state,),
            attempt=record.attempt,
            fields=spec_fields(target),
        ):
            await _reload(deps, record.job_id)
            await run_cycle(deps)
    elif record.state == "placed":
        if target == record.spec:
            return  # already at that size
        await interrupt_placed(
            deps, record, InterruptCause.SCALED, reason, next_spec_fields(target)
        )
    elif record.state == "interrupting" and record.interrupt is not None:
        # Its next attempt (or its pause) takes the new size.
        if target != record.next_spec:
            await deps.store.change(
                record.job_id,
                states=("interrupting",),
                attempt=record.attempt,
                fields=next_spec_fields(target),
            )
        else:
            await _send_interrupt(deps, record.job_id, record.attempt, *record.interrupt)


async def release_interrupted(event: JobInterrupted, delivery: Delivery, deps: Deps) -> None:
    """An attempt ended without failing: give its capacity back, then pause the job,
    stop it (a stop came meanwhile) or queue its next attempt, spending no retry."""
    record = await deps.store.get(event.job_id)
    if record is None:
        return
    if record.attempt == event.attempt and record.state in ("placed", "interrupting"):
        await _end_interrupted(deps, record, event)
        await run_cycle(deps)
    elif record.attempt == event.attempt and record.state == "done" and record.stopped_in_queue:
        # A redelivery after a crash between storing the stop and announcing it.
        await _announce_stopped(deps, record.job_id, record.attempt, record.stop_reason)
    elif (
        record.attempt == event.attempt + 1
        and record.state == "paused"
        and (event.cause != InterruptCause.PAUSED)
    ):
        # Likewise for a job paused while it was on its way out for another cause.
        await _announce_paused(deps, record.job_id, record.attempt, event.reason)


async def _end_interrupted(deps: Deps, record: JobRecord, event: JobInterrupted) -> None:
    job_id, attempt = record.job_id, record.attempt
    cause, reason = record.interrupt or (event.cause.value, event.reason)
    states: tuple[JobStoreState, ...] = ("placed", "interrupting")
    if record.stop_reason is not None:
        if await deps.store.change(
            job_id,
            states=states,
            attempt=attempt,
            fields={"state": "done", "stopped_in_queue": True},
        ):
            await _reload(deps, job_id)
            await _announce_stopped(deps, job_id, attempt, record.stop_reason)
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
            await _reload(deps, job_id)
            await _announce_paused(deps, job_id, attempt + 1, reason)
            return
    else:
        await deps.store.change(
            job_id,
            states=states,
            attempt=attempt,
            fields=next_attempt_fields(attempt + 1, record.next_spec),
        )
    await _reload(deps, job_id)


async def stop_interrupted(event: StopJob, record: JobRecord, deps: Deps) -> None:
    """StopJob for a job that holds no running attempt: a paused job ends here; one
    being interrupted ends when its JobInterrupted comes (the launcher is ending it)."""
    if record.state == "paused":
        if await deps.store.change(
            record.job_id,
            states=("paused",),
            attempt=record.attempt,
            fields={"state": "done", "stopped_in_queue": True, **stop_reason_fields(PAUSED_STOP)},
        ):
            await _announce_stopped(deps, record.job_id, record.attempt, PAUSED_STOP)
            await run_cycle(deps)
    elif record.state == "interrupting":
        await deps.store.change(
            record.job_id,
            states=("interrupting",),
            attempt=record.attempt,
            fields=stop_reason_fields(event.reason),
        )


def _carried(before: JobRecord) -> dict[str, Any]:
    """The attempt being interrupted failed first (JobRetrying): what the interrupt was
    for applies to the queued retry instead — a stop, a pause, a new size."""
    if before.state != "interrupting":
        return {}
    if before.stop_reason is not None:
        return {"state": "done", "stopped_in_queue": True, **stop_reason_fields(before.stop_reason)}
    if before.interrupt is not None and before.interrupt[0] == InterruptCause.PAUSED:
        return {**paused_fields(before.next_spec), "not_before": None}
    if before.next_spec is not None:
        return spec_fields(before.next_spec)
    return {}


async def _announce_carried(deps: Deps, before: JobRecord, attempt: int) -> None:
    """Announce the end or the pause :func:`_carried` gave the retry (ids derived from
    the new attempt, so a redelivery announces the same events)."""
    carried = _carried(before)
    if carried.get("state") == "done":
        await _announce_stopped(deps, before.job_id, attempt, before.stop_reason)
    elif carried.get("state") == "paused" and before.interrupt is not None:
        await _announce_paused(deps, before.job_id, attempt, before.interrupt[1])


async def _known(deps: Deps, job_id: str, delivery: Delivery) -> JobRecord | None:
    record = await deps.store.get(job_id)
    if record is None and delivery.num_delivered < EARLY_COMMAND_DELIVERIES:
        # Intake knows the job but validation has not passed it on yet: try again later.
        # A job that never comes (rejected) has the command dropped after a while.
        raise TransientError(f"job {job_id} is not known to placement yet")
    if record is None:
        log.warning("dropping a command for job %s, which placement never got", job_id)
    return record


async def _send_interrupt(
    deps: Deps, job_id: str, attempt: int, cause: InterruptCause | str, reason: str
) -> None:
    await deps.publisher.publish(InterruptJob(
        event_id=interrupt_id(job_id, attempt, cause), job_id=job_id, attempt=attempt,
        cause=InterruptCause(cause), reason=reason,
    ))  # fmt: skip


async def _announce_paused(deps: Deps, job_id: str, attempt: int, reason: str) -> None:
    await deps.publisher.publish(JobInterrupted(
        event_id=interrupted_id(job_id, attempt), job_id=job_id, attempt=attempt,
        cause=InterruptCause.PAUSED, reason=reason,
    ))  # fmt: skip


async def _announce_stopped(deps: Deps, job_id: str, attempt: int, reason: str | None) -> None:
    await deps.publisher.publish(JobFinished(
        event_id=finished_id(job_id, attempt), job_id=job_id, attempt=attempt,
        state=JobState.STOPPED, reason=reason or PAUSED_STOP,
    ))  # fmt: skip


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
    if record.state in ("done", "stopped_early"):
        raise JobEnded(job_id)
    problem = scale_problem(spec, role, replicas)
    if problem is not None:
        raise ScaleRefused(problem)
    command = ScaleJob(job_id=job_id, requested_by=identity.user, role=role, replicas=replicas)
    await deps.publisher.publish(command)
    return command


EventHandler = Callable[[Any, Delivery, Deps], Awaitable[None]]

EVENT_HANDLERS: dict[type[Event], EventHandler] = {
    JobAccepted: queue_job,
    JobFinished: release_job,
    JobRetrying: retry_job,
    StopJob: stop_job,
    PauseJob: pause_job,
    ResumeJob: resume_job,
    ScaleJob: scale_job,
    RestartJob: restart_job,
    JobInterrupted: release_interrupted,
}


async def handle(event: Event, delivery: Delivery, deps: Deps) -> None:
    handler = EVENT_HANDLERS.get(type(event))
    if handler is None:
        return
    async with deps.lock:
        await handler(event, delivery, deps)


# --- the scheduling cycle --------------------------------------------------------------


SHUTDOWN_REASON = "the platform was shut down; the job runs again when it is back"


async def shut_down(deps: Deps) -> list[str]:
    """Place nothing more, and end every running attempt as interrupted (cause
    ``shutdown``): its tasks stop, and the next start of the platform queues the job's
    next attempt, spending no retry. Returns the jobs told to end."""
    async with deps.lock:
        deps.draining = True
        interrupted = []
        for job_id in sorted(deps.state.placed):
            record = await deps.store.get(job_id)
            if record is not None and record.state == "placed":
                if await interrupt_placed(deps, record, InterruptCause.SHUTDOWN, SHUTDOWN_REASON):
                    interrupted.append(job_id)
        return interrupted


async def run_cycle(deps: Deps) -> None:
    """Place what fits now and tell waiting jobs why they wait. Call with the lock held."""
    # 1. Announce placements a crash or a failed publish left unannounced.
    for job_id in sorted(deps.unannounced):
        await _announce_placed(deps, deps.state.placed[job_id])
    for job_id in sorted(deps.unsent_preemptions):
        await _resend_preemption(deps, job_id)
    if deps.draining:
        return  # shutting down: the next start places what waits
    # 2. Decide, on a snapshot derived from the placed jobs' allocations; retries whose
    #    backoff ended join the queue first.
    now = deps.clock()
    for job_id, (job, not_before) in list(deps.deferred.items()):
        if not_before <= now:
            del deps.deferred[job_id]
            deps.state.enqueue(job)
    decisions = deps.state.cycle(now=now.timestamp())
    # 3. Store each placement, then take it into memory, then announce it; the next
    #    decisions already counted its capacity as used.
    waiting: dict[str, Waiting] = {}
    for decision in decisions:
        if isinstance(decision, Placed):
            await _commit_placement(deps, decision)
        elif isinstance(decision, Preempt):
            await _preempt(deps, decision)
        else:
            waiting[decision.job_id] = decision
    for job_id, (job, not_before) in sorted(deps.deferred.items(), key=lambda d: d[1][1]):
        waiting[job_id] = Waiting(
            job_id,
            len(waiting) + 1,
            (
                # Milliseconds, as the store keeps them: the same words after a restart.
                f"retrying attempt {job.attempt} after backoff until "
                f"{not_before.isoformat(timespec='milliseconds')}",
            ),
            job.attempt,
        )
    deps.waiting = waiting
    # 4. Explain the wait, only when the explanation changed.
    for decision in waiting.values():
        await _notify_waiting(deps, decision)
    # 5. With nobody waiting, elastic jobs below their size grow into the free capacity.
    if not waiting:
        await _grow(deps, now.timestamp())


async def _grow(deps: Deps, now: float) -> None:
    """Restart each elastic job that fits at a larger size (never above the size asked
    for, ``replicas``, which ScaleJob sets) as its next attempt (docs/placement.md,
    "Elastic"). Its capacity stays held until its JobInterrupted."""
    targets: dict[str, dict[str, int]] = {}
    for job_id, role, replicas in growth(deps.state):
        targets.setdefault(job_id, {})[role] = replicas
    for job_id, roles in sorted(targets.items()):
        if now - deps.state.placed_at.get(job_id, now) < deps.growth_after_s:
            continue
        record = await deps.store.get(job_id)
        if record is None or record.state != "placed" or record.spec is None:
            continue
        running = deps.state.placed[job_id].spec
        grown = {
            name: min(replicas, record.spec.role(name).replicas) for name, replicas in roles.items()
        }
        grown = {name: n for name, n in grown.items() if n > running.role(name).replicas}
        if not grown:
            continue  # already at the size asked for
        words = ", ".join(
            f"{name} {running.role(name).replicas} -> {n}" for name, n in sorted(grown.items())
        )
        await interrupt_placed(
            deps, record, InterruptCause.SCALED, f"growing into freed capacity: {words} replica(s)"
        )


async def _preempt(deps: Deps, decision: Preempt) -> None:
    """Interrupt each victim once (docs/placement.md, "Preemption"): placed ->
    interrupting with who preempted it and its count, then InterruptJob. It keeps its
    capacity until its JobInterrupted; the preemptor waits for that."""
    for victim in decision.victims:
        record = await deps.store.get(victim)
        if record is None or record.state != "placed":
            if record is not None and record.state == "interrupting":
                # Already on its way out for another cause: never chosen again.
                deps.state.interrupting.setdefault(victim, None)
            continue
        count = deps.state.preemptions.get(victim, 0) + 1
        if await interrupt_placed(
            deps,
            record,
            InterruptCause.PREEMPTED,
            decision.reason,
            preempted_fields(decision.job_id, count),
        ):
            deps.state.preempting(victim, decision.job_id)
            await deps.store.change(
                victim,
                states=("interrupting",),
                attempt=record.attempt,
                fields=interrupt_sent_fields(),
            )


def _adopt_preemption(deps: Deps, record: JobRecord) -> None:
    if record.preemptions:
        deps.state.preemptions[record.job_id] = record.preemptions
    if record.state != "interrupting":
        return
    preempted = record.interrupt is not None and record.interrupt[0] == InterruptCause.PREEMPTED
    # preempted_by outlives a pause asked for meanwhile (it is cleared with the attempt):
    # the preemptor still waits for this victim and must not choose another.
    deps.state.interrupting[record.job_id] = record.preempted_by
    if record.interrupt is not None and not (preempted and record.interrupt_sent):
        # Only preemptions note that their InterruptJob went out: any other interrupt
        # is sent again at start (same event id; the launcher answers a repeat in kind).
        deps.unsent_preemptions.add(record.job_id)


async def _resend_preemption(deps: Deps, job_id: str) -> None:
    record = await deps.store.get(job_id)
    deps.unsent_preemptions.discard(job_id)
    if record is None or record.state != "interrupting" or record.interrupt is None:
        return
    await _send_interrupt(deps, job_id, record.attempt, *record.interrupt)
    await deps.store.change(
        job_id, states=("interrupting",), attempt=record.attempt, fields=interrupt_sent_fields()
    )


async def _commit_placement(deps: Deps, decision: Placed) -> None:
    allocation = decision.allocation
    if not await deps.store.mark_placed(allocation.job_id, allocation.tasks):
        # Memory and store disagree (an update that landed but whose reply was lost,
        # or a second writer): the store wins.
        log.warning("job %s was not queued in the store; reloading it", allocation.job_id)
        await _reload(deps, allocation.job_id)
        return
    deps.state.commit(allocation, placed_at=deps.clock().timestamp())
    deps.attempts[allocation.job_id] = decision.attempt
    deps.notices.pop(allocation.job_id, None)
    deps.unannounced.add(allocation.job_id)
    await _announce_placed(deps, allocation)


async def _announce_placed(deps: Deps, allocation: Allocation) -> None:
    attempt = deps.attempts.get(allocation.job_id, FIRST_ATTEMPT)
    await deps.publisher.publish(JobPlaced(
        event_id=placed_id(allocation.job_id, attempt),
        job_id=allocation.job_id,
        attempt=attempt,
        spec=allocation.spec,
        tasks=list(allocation.tasks),
        retries_used=deps.retries_used.get(allocation.job_id, attempt - 1),
    ))  # fmt: skip
    await deps.store.mark_placed_published(allocation.job_id)
    deps.unannounced.discard(allocation.job_id)


_BEHIND = re.compile(r"^waiting behind job \S+ at the head of ")


def notice_key(reasons: tuple[str, ...], position: int) -> tuple[tuple[str, ...], int]:
    """What must change for a waiting job to be told again (a new JobQueued): its own
    reasons, but not which job happens to head its queue (every job behind a head would
    be told again each time the head changes: quadratic in the queue), and the order of
    magnitude of its position (1, 2-10, 11-100, ...: each job crosses a handful of those
    on its way to the head, not one per job placed ahead of it). The queue view shows the
    exact position and the current head at any time."""
    kinds = tuple(_BEHIND.sub("waiting behind the head of ", reason) for reason in reasons)
    return kinds, 0 if position <= 1 else math.ceil(math.log10(position))


async def _notify_waiting(deps: Deps, decision: Waiting) -> None:
    sent, last = deps.notices.get(decision.job_id, (0, None))
    key = notice_key(decision.reasons, decision.position)
    if last is not None and last[1] < 0 and last[0] == key[0]:
        # Restored after a restart with its reasons but not its position: the same
        # reasons need no new notice; the position's class is known from now on.
        deps.notices[decision.job_id] = (sent, key)
        return
    if key == last:
        return
    notice = sent + 1
    # Published before it is recorded: it is only information, and a crash in between
    # re-publishes the same id, which JetStream drops.
    await deps.publisher.publish(JobQueued(
        event_id=queued_id(decision.job_id, decision.attempt, notice, decision.reasons),
        job_id=decision.job_id,
        attempt=decision.attempt,
        position=decision.position,
        reasons=list(decision.reasons),
    ))  # fmt: skip
    await deps.store.note_reasons(decision.job_id, decision.reasons, notice)
    deps.notices[decision.job_id] = (notice, key)


async def _announce_stopped_in_queue(deps: Deps, record: JobRecord) -> None:
    await deps.publisher.publish(JobFinished(
        event_id=finished_id(record.job_id, record.attempt),
        job_id=record.job_id,
        attempt=record.attempt,
        state=JobState.STOPPED,
        reason="stopped while queued",
    ))  # fmt: skip


def _forget_queued(deps: Deps, job_id: str) -> None:
    deps.state.dequeue(job_id)
    deps.deferred.pop(job_id, None)
    deps.notices.pop(job_id, None)
    deps.waiting.pop(job_id, None)


async def _reload(deps: Deps, job_id: str) -> None:
    _forget_queued(deps, job_id)
    deps.state.release(job_id)
    deps.attempts.pop(job_id, None)
    deps.retries_used.pop(job_id, None)
    deps.unannounced.discard(job_id)
    record = await deps.store.get(job_id)
    if record is not None:
        _adopt(deps, record)


def _adopt(deps: Deps, record: JobRecord) -> None:
    if record.spec is None:
        return
    if record.state in ACTIVE_STATES:
        deps.retries_used[record.job_id] = record.retries_used
    if record.state == "queued":
        job = QueuedJob(record.job_id, record.spec, record.arrival_seq, record.attempt)
        if record.not_before is not None and record.not_before > deps.clock():
            deps.deferred[record.job_id] = (job, record.not_before)
        else:
            deps.state.enqueue(job)
        if record.reasons:
            # Its position's class is not stored: -1 until the next cycle knows it.
            deps.notices[record.job_id] = (
                record.queued_notices,
                (notice_key(tuple(record.reasons), 1)[0], -1),
            )
        _adopt_preemption(deps, record)
    elif record.state in ("placed", "interrupting"):
        # An interrupting job holds its allocation until the launcher lets it go.
        deps.state.commit(
            Allocation(record.job_id, record.spec, record.allocation),
            placed_at=record.placed_at.timestamp() if record.placed_at else None,
        )
        _adopt_preemption(deps, record)
        deps.attempts[record.job_id] = record.attempt
        if not record.placed_published:
            deps.unannounced.add(record.job_id)


# --- startup and views -----------------------------------------------------------------


async def load(store: JobStore, publisher: Publisher, cluster: ClusterSpec) -> Deps:
    """Rebuild the in-memory state from the store: every queued and placed job, each
    counted once, since capacity is derived from the placed jobs' allocations."""
    deps = Deps(store=store, publisher=publisher, state=SchedulerState(cluster))
    for record in await store.active():
        _adopt(deps, record)
    return deps


async def start(deps: Deps) -> None:
    """First cycle after a (re)start: re-announces unannounced placements and places
    whatever fits after changes the previous process stored but did not act on."""
    async with deps.lock:
        await run_cycle(deps)


async def wake_retries(deps: Deps, stop: asyncio.Event, interval_s: float = 0.2) -> None:
    """Run a cycle when a retried job's backoff ends (no event marks that moment)."""
    while not stop.is_set():
        now = deps.clock()
        if any(not_before <= now for _, not_before in deps.deferred.values()):
            try:
                async with deps.lock:
                    await run_cycle(deps)
            except Exception:  # noqa: BLE001 - the next event or look runs the cycle again
                log.exception("placing due retries failed; trying again")
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            pass


def queue_view(deps: Deps) -> list[dict[str, Any]]:
    rows = []
    for verdict in sorted(deps.waiting.values(), key=lambda w: w.position):
        job = deps.state.queued.get(verdict.job_id)
        if job is None and verdict.job_id in deps.deferred:
            job = deps.deferred[verdict.job_id][0]
        if job is None:
            continue
        rows.append({
            "job_id": verdict.job_id,
            "name": job.spec.name,
            "user": job.spec.user,
            "queue": job.spec.queue,
            "priority": job.spec.priority,
            "position": verdict.position,
            "reasons": list(verdict.reasons),
        })  # fmt: skip
    return rows
