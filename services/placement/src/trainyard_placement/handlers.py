"""Placement's service layer: one handler per event or command, and the scheduling cycle.

Every handler is idempotent (docs/design/0001): a stored state change is a conditional
update, each published event has an id derived from its cause, and the effect is stored
before it is announced. Handling is serialized by one lock, so one cycle runs at a time
and the in-memory state always matches the store after each handler.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobState,
    StopJob,
    derived_id,
)

from .adapters.store import JobRecord, JobStore
from .domain import Allocation, Placed, QueuedJob, SchedulerState, Waiting

log = logging.getLogger("trainyard.placement")

# Attempts are counted from 1; retries that requeue a job are a later issue.
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


EventHandler = Callable[[Any, Delivery, Deps], Awaitable[None]]

EVENT_HANDLERS: dict[type[Event], EventHandler] = {
    JobAccepted: queue_job,
    JobFinished: release_job,
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
    # 2. Decide, on a snapshot derived from the placed jobs' allocations.
    decisions = deps.state.cycle()
    # 3. Store each placement, then take it into memory, then announce it; the next
    #    decisions already counted its capacity as used.
    waiting: dict[str, Waiting] = {}
    for decision in decisions:
        if isinstance(decision, Placed):
            await _commit_placement(deps, decision)
        else:
            waiting[decision.job_id] = decision
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
    deps.notices.pop(allocation.job_id, None)
    deps.unannounced.add(allocation.job_id)
    await _announce_placed(deps, allocation)


async def _announce_placed(deps: Deps, allocation: Allocation) -> None:
    await deps.publisher.publish(JobPlaced(
        event_id=placed_id(allocation.job_id, FIRST_ATTEMPT),
        job_id=allocation.job_id,
        attempt=FIRST_ATTEMPT,
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
    deps.notices.pop(job_id, None)
    deps.waiting.pop(job_id, None)


async def _reload(deps: Deps, job_id: str) -> None:
    _forget_queued(deps, job_id)
    deps.state.release(job_id)
    deps.unannounced.discard(job_id)
    record = await deps.store.get(job_id)
    if record is not None:
        _adopt(deps, record)


def _adopt(deps: Deps, record: JobRecord) -> None:
    if record.spec is None:
        return
    if record.state == "queued":
        deps.state.enqueue(
            QueuedJob(record.job_id, record.spec, record.arrival_seq, record.attempt)
        )
        if record.reasons:
            deps.notices[record.job_id] = (record.queued_notices, record.reasons)
    elif record.state == "placed":
        deps.state.commit(Allocation(record.job_id, record.spec, record.allocation))
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


def queue_view(deps: Deps) -> list[dict[str, Any]]:
    rows = []
    for verdict in sorted(deps.waiting.values(), key=lambda w: w.position):
        job = deps.state.queued.get(verdict.job_id)
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
