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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobRetrying,
    JobState,
    StopJob,
    derived_id,
    utcnow,
)

from .adapters.store import JobRecord, JobStore
from .domain import Allocation, Placed, QueuedJob, SchedulerState, Waiting

log = logging.getLogger("trainyard.placement")

# Attempts are counted from 1; a retry (JobRetrying) queues the next one.
FIRST_ATTEMPT = 1


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
    # What the last JobQueued of each waiting job said, and how many were sent.
    notices: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    # The last cycle's verdict on each waiting job, for the queue view.
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # Retried jobs whose backoff has not ended: (job, not_before), outside the queue.
    deferred: dict[str, tuple[QueuedJob, datetime]] = field(default_factory=dict)
    # The attempt of each placed job (its JobPlaced carries it).
    attempts: dict[str, int] = field(default_factory=dict)


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
    inserted = await deps.store.add_queued(
        job.job_id, attempt=job.attempt, arrival_seq=job.arrival_seq, spec=job.spec
    )
    if inserted:
        deps.state.enqueue(job)
    else:
        record = await deps.store.get(job.job_id)
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
    if record.state == "placed":
        await deps.store.mark_done(record.job_id, "placed")
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
    # placed: the launcher stops it and announces JobFinished; stopped_early: a repeat.


async def retry_job(event: JobRetrying, delivery: Delivery, deps: Deps) -> None:
    """The launcher gave up on an attempt and asks for the next: give the old
    allocation back and queue the job again, due at ``event.not_before``."""
    record = await deps.store.get(event.job_id)
    if record is None or record.attempt < event.previous_attempt:
        return
    if record.attempt == event.previous_attempt and record.state == "placed":
        if not await deps.store.requeue(record.job_id, from_attempt=event.previous_attempt,
                                        attempt=event.attempt, not_before=event.not_before):
            log.warning("job %s was not placed in attempt %d in the store; reloading it",
                        record.job_id, event.previous_attempt)
        await _reload(deps, record.job_id)
    elif record.attempt == event.attempt and record.state == "queued" and (
            record.job_id not in deps.state.queued and record.job_id not in deps.deferred):
        # A redelivery after the store moved on but memory did not (a failed handler).
        await _reload(deps, record.job_id)
    await run_cycle(deps)


EventHandler = Callable[[Any, Delivery, Deps], Awaitable[None]]

EVENT_HANDLERS: dict[type[Event], EventHandler] = {
    JobAccepted: queue_job,
    JobFinished: release_job,
    JobRetrying: retry_job,
    StopJob: stop_job,
}


async def handle(event: Event, delivery: Delivery, deps: Deps) -> None:
    handler = EVENT_HANDLERS.get(type(event))
    if handler is None:
        return
    async with deps.lock:
        await handler(event, delivery, deps)


# --- the scheduling cycle --------------------------------------------------------------


async def run_cycle(deps: Deps) -> None:
    """Place what fits now and tell waiting jobs why they wait. Call with the lock held."""
    # 1. Announce placements a crash or a failed publish left unannounced.
    for job_id in sorted(deps.unannounced):
        await _announce_placed(deps, deps.state.placed[job_id])
    # 2. Decide, on a snapshot derived from the placed jobs' allocations; retries whose
    #    backoff ended join the queue first.
    now = utcnow()
    for job_id, (job, not_before) in list(deps.deferred.items()):
        if not_before <= now:
            del deps.deferred[job_id]
            deps.state.enqueue(job)
    decisions = deps.state.cycle()
    # 3. Store each placement, then take it into memory, then announce it; the next
    #    decisions already counted its capacity as used.
    waiting: dict[str, Waiting] = {}
    for decision in decisions:
        if isinstance(decision, Placed):
            await _commit_placement(deps, decision)
        else:
            waiting[decision.job_id] = decision
    for job_id, (job, not_before) in sorted(deps.deferred.items(), key=lambda d: d[1][1]):
        waiting[job_id] = Waiting(job_id, len(waiting) + 1, (
            # Milliseconds, as the store keeps them: the same words after a restart.
            f"retrying attempt {job.attempt} after backoff until "
            f"{not_before.isoformat(timespec='milliseconds')}",
        ), job.attempt)
    deps.waiting = waiting
    # 4. Explain the wait, only when the explanation changed.
    for decision in waiting.values():
        await _notify_waiting(deps, decision)


async def _commit_placement(deps: Deps, decision: Placed) -> None:
    allocation = decision.allocation
    if not await deps.store.mark_placed(allocation.job_id, allocation.tasks):
        # Memory and store disagree (an update that landed but whose reply was lost,
        # or a second writer): the store wins.
        log.warning("job %s was not queued in the store; reloading it", allocation.job_id)
        await _reload(deps, allocation.job_id)
        return
    deps.state.commit(allocation)
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
    ))  # fmt: skip
    await deps.store.mark_placed_published(allocation.job_id)
    deps.unannounced.discard(allocation.job_id)


async def _notify_waiting(deps: Deps, decision: Waiting) -> None:
    sent, last = deps.notices.get(decision.job_id, (0, ()))
    if decision.reasons == last:
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
    deps.notices[decision.job_id] = (notice, decision.reasons)


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
    deps.unannounced.discard(job_id)
    record = await deps.store.get(job_id)
    if record is not None:
        _adopt(deps, record)


def _adopt(deps: Deps, record: JobRecord) -> None:
    if record.spec is None:
        return
    if record.state == "queued":
        job = QueuedJob(record.job_id, record.spec, record.arrival_seq, record.attempt)
        if record.not_before is not None and record.not_before > utcnow():
            deps.deferred[record.job_id] = (job, record.not_before)
        else:
            deps.state.enqueue(job)
        if record.reasons:
            deps.notices[record.job_id] = (record.queued_notices, record.reasons)
    elif record.state == "placed":
        deps.state.commit(Allocation(record.job_id, record.spec, record.allocation))
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
        now = utcnow()
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
