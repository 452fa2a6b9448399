"""What placement's handlers share: their dependencies, the ids of what they publish, and
keeping the in-memory state and the store as one (reload, adopt, announce)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from trainyard_common.errors import TransientError
from trainyard_common.events import (
    Event,
    InterruptCause,
    InterruptJob,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobState,
    TasksPlaced,
    derived_id,
    utcnow,
)
from trainyard_common.jobspec import JobSpec
from trainyard_common.lifecycle import PlacementState as P
from trainyard_common.telemetry import continue_trace, current_traceparent

from ..adapters.store import (
    ACTIVE_STATES,
    JobRecord,
    JobStore,
    interrupting_fields,
    paused_fields,
    spec_fields,
    stop_reason_fields,
)
from ..domain import Allocation, QueuedJob, SchedulerState, Waiting
from ..domain.elastic import ScaleProblem

log = logging.getLogger("trainyard.placement")


# Attempts are counted from 1; a retry (JobRetrying) queues the next one.
FIRST_ATTEMPT = 1


SUBMITTED_PAUSED = "submitted to start paused: waiting for a resume"


PAUSED_STOP = "stopped while paused"


class Publisher(Protocol):
    async def publish(self, event: Event) -> Any: ...


# What a waiting job was last told (notice_key): its reasons' kinds and its position's
# order of magnitude.
NoticeKey = tuple[tuple[str, ...], int]


@dataclass
class Deps:
    store: JobStore
    publisher: Publisher
    state: SchedulerState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Placed jobs whose JobPlaced is not known to be published yet.
    unannounced: set[str] = field(default_factory=set)
    # How many JobQueued each waiting job was sent, and the notice key of the last one.
    notices: dict[str, tuple[int, NoticeKey | None]] = field(default_factory=dict)
    # The last cycle's verdict on each waiting job, for the queue view.
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # Of those, the queue's (not the retries in backoff), and whether the last cycle's
    # were all handled (then a cycle that carries them on handles only its new ones).
    queue_waiting: dict[str, Waiting] = field(default_factory=dict)
    waiting_handled: bool = False
    # Retried jobs whose backoff has not ended: (job, not_before), outside the queue.
    deferred: dict[str, tuple[QueuedJob, datetime]] = field(default_factory=dict)
    # The attempt of each placed job (its JobPlaced carries it).
    attempts: dict[str, int] = field(default_factory=dict)
    # The retry budget each queued or placed job has spent (its JobPlaced carries it).
    retries_used: dict[str, int] = field(default_factory=dict)
    # Interrupted jobs whose InterruptJob a crash or a failed publish may have kept from
    # going out: each cycle sends them first.
    unsent_interrupts: set[str] = field(default_factory=set)
    # Placed jobs without gang placement, as submitted (their allocation's spec counts
    # only the tasks placed so far): what JobPlaced carries, and what is left to place.
    ungang: dict[str, JobSpec] = field(default_factory=dict)
    # Of those, the ones given tasks whose TasksPlaced is not known to be published, and
    # the tasks of each that ended and gave their capacity back (never placed again).
    unannounced_tasks: set[str] = field(default_factory=set)
    released: dict[str, frozenset[tuple[str, int]]] = field(default_factory=dict)
    # An elastic job grows only after running this long at its size, so capacity that
    # frees in bursts does not restart it again and again.
    growth_after_s: float = 30.0
    # The platform is shutting down: nothing more is placed by this process.
    draining: bool = False
    # Whether this replica still holds placement's lease, asked before every cycle and
    # every publish: a replica whose event loop stalled past its lease must not act on
    # what it decided while another replica leads.
    leading: Callable[[], bool] = lambda: True
    # A handler brought a job back into memory (catch_up): a cycle must follow.
    caught_up: bool = False
    # The service's consumer runs one cycle per batch of messages, not one per message
    # (a cycle walks the whole queue: per message, a burst cost the square of its size).
    # ``in_message``: a message's handler is running, so a cycle it asks for is only
    # noted (``cycle_due``) and runs after the batch (run_due_cycle).
    defer_cycles: bool = False
    in_message: bool = False
    cycle_due: bool = False
    # Each active job's trace (the traceparent of the last message handled for it): what
    # placement publishes about a job continues that job's trace, whichever message's
    # cycle decided it.
    traces: dict[str, str] = field(default_factory=dict)
    # What time it is (tests pass a clock they move instead of sleeping).
    clock: Callable[[], datetime] = utcnow


def note_trace(deps: Deps, job_id: str) -> None:
    """Keep the current message's trace for ``job_id`` (and forget ended jobs' per-job
    entries: forget_ended)."""
    if (traceparent := current_traceparent()) is not None:
        deps.traces[job_id] = traceparent
    forget_ended(deps, keep=job_id)


def forget_ended(deps: Deps, keep: str | None = None) -> None:
    """Drop the traces, attempts, retry and preemption counts of jobs no longer in
    memory (ended, or paused: a resume reads them back from the store, as a restart
    does for every job), once there are many more of them than jobs in memory:
    amortized, one pass per so many ended jobs. Kept, they were an entry each per job
    in placement's history (found by bench/pipeline.py --history); the preemption
    counts are also compared by every cycle (SchedulerState._inputs)."""
    limit = 1000 + 2 * (len(deps.state.queued) + len(deps.state.placed) + len(deps.deferred))
    most = max(len(deps.traces), len(deps.attempts), len(deps.retries_used),
               len(deps.state.preemptions))  # fmt: skip
    if most <= limit:  # (every message comes here: no generator)
        return
    active = deps.state.queued.keys() | deps.state.placed.keys() | deps.deferred.keys()
    if keep is not None:
        active.add(keep)
    deps.traces = {j: t for j, t in deps.traces.items() if j in active}
    deps.attempts = {j: a for j, a in deps.attempts.items() if j in active}
    deps.retries_used = {j: r for j, r in deps.retries_used.items() if j in active}
    deps.state.preemptions = {j: n for j, n in deps.state.preemptions.items() if j in active}


class NotLeader(TransientError):
    """This replica lost placement's lease: it publishes nothing more."""


def ensure_leading(deps: Deps, what: str) -> None:
    """Raises NotLeader unless this replica still holds the lease, checked right before
    a store write a cycle decided: a loop stalled past the lease (a pause, a long GC)
    would otherwise store one stale placement after the next leader had loaded its
    state, and both could promise the same GPUs. (The write itself is not fenced: the
    window is the one await of the write.)"""
    if not deps.leading():
        raise NotLeader(f"not leading: {what} not stored")


async def publish(deps: Deps, event: Event) -> None:
    """Publish in the job's own trace (a deferred cycle runs outside every message's
    span); only while this replica leads."""
    if not deps.leading():
        raise NotLeader(f"not leading: {type(event).__name__} of job {event.job_id} not sent")
    with continue_trace(deps.traces.get(event.job_id), event.job_id):
        await deps.publisher.publish(event)


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
        await announce_placed(deps, deps.state.placed[record.job_id])
    ensure_leading(deps, f"the interrupt of job {record.job_id}")
    changed = await deps.store.change(
        record.job_id,
        states=(P.PLACED,),
        attempt=record.attempt,
        fields={**interrupting_fields(cause.value, reason), **(fields or {})},
    )
    if changed:
        # Noted until it went out: a cycle that interrupts (a preemption, a growth, the
        # shutdown) has no redelivery to send it again, and the job, interrupting now,
        # is not interrupted twice.
        deps.unsent_interrupts.add(record.job_id)
        await send_interrupt(deps, record.job_id, record.attempt, cause, reason)
        deps.unsent_interrupts.discard(record.job_id)
    return changed


def carried_fields(before: JobRecord) -> dict[str, Any]:
    """The attempt being interrupted failed first (JobRetrying): what the interrupt was
    for applies to the queued retry instead — a stop, a pause, a new size."""
    if before.state != P.INTERRUPTING:
        return {}
    if before.stop_reason is not None:
        return {"state": P.DONE, "stopped_in_queue": True, **stop_reason_fields(before.stop_reason)}
    if before.interrupt is not None and before.interrupt[0] == InterruptCause.PAUSED:
        return {**paused_fields(before.next_spec), "not_before": None}
    if before.next_spec is not None:
        return spec_fields(before.next_spec)
    return {}


async def announce_carried(deps: Deps, before: JobRecord, attempt: int) -> None:
    """Announce the end or the pause :func:`carried_fields` gave the retry (ids derived from
    the new attempt, so a redelivery announces the same events)."""
    carried = carried_fields(before)
    if carried.get("state") == P.DONE:
        await announce_stopped(deps, before.job_id, attempt, before.stop_reason)
    elif carried.get("state") == P.PAUSED and before.interrupt is not None:
        await announce_paused(deps, before.job_id, attempt, before.interrupt[1])


async def known_record(deps: Deps, job_id: str) -> JobRecord:
    """The record a user's command acts on. Intake takes a command for a job as soon as
    it is submitted: one validation has not passed on yet waits, redelivered for as long
    as the bus redelivers (its 50 deliveries, some 7 minutes). A job validation rejects
    leaves a record that ends the wait (the command then finds the job ended); past the
    deliveries (validation down longer, or a job that never comes) the command is in the
    dead letters, saying so, for an admin to replay: never dropped unseen."""
    record = await deps.store.get(job_id)
    if record is None:
        raise TransientError(f"job {job_id} is not known to placement yet")
    await catch_up(deps, record)
    return record


async def catch_up(deps: Deps, record: JobRecord) -> None:
    """Make memory match the store for a job where it does not: a write that landed
    whose answer was lost (the store died in between) raised before memory was updated,
    and its redelivery finds the store moved on (its own write now changes nothing).
    Left so, a job queued in the store would never be placed, one paused or ended would
    hold its capacity for ever, and a queued job would be placed at its old size or
    priority."""
    if not in_memory_as_stored(deps, record):
        log.warning("job %s in memory is not as stored (%s); reloading it", record.job_id,
                    record.state)  # fmt: skip
        await reload_job(deps, record.job_id)
        deps.caught_up = True  # a cycle must consider it (handle runs one)


def in_memory_as_stored(deps: Deps, record: JobRecord) -> bool:
    job_id = record.job_id
    waiting = deps.state.queued.get(job_id)
    if waiting is None and job_id in deps.deferred:
        waiting = deps.deferred[job_id][0]
    held = job_id in deps.state.placed
    if record.state == P.QUEUED:
        return (
            not held
            and waiting is not None
            and (waiting.attempt, waiting.spec) == (record.attempt, record.spec)
        )
    if record.state in (P.PLACED, P.INTERRUPTING):
        return waiting is None and held
    return waiting is None and not held


async def send_interrupt(
    deps: Deps, job_id: str, attempt: int, cause: InterruptCause | str, reason: str
) -> None:
    await publish(deps, InterruptJob(
        event_id=interrupt_id(job_id, attempt, cause), job_id=job_id, attempt=attempt,
        cause=InterruptCause(cause), reason=reason,
    ))  # fmt: skip


async def announce_paused(deps: Deps, job_id: str, attempt: int, reason: str) -> None:
    await publish(deps, JobInterrupted(
        event_id=interrupted_id(job_id, attempt), job_id=job_id, attempt=attempt,
        cause=InterruptCause.PAUSED, reason=reason,
    ))  # fmt: skip


async def announce_stopped(deps: Deps, job_id: str, attempt: int, reason: str | None) -> None:
    await publish(deps, JobFinished(
        event_id=finished_id(job_id, attempt), job_id=job_id, attempt=attempt,
        state=JobState.STOPPED, reason=reason or PAUSED_STOP,
    ))  # fmt: skip


def adopt_preemption(deps: Deps, record: JobRecord) -> None:
    if record.preemptions:
        deps.state.preemptions[record.job_id] = record.preemptions
    if record.state != P.INTERRUPTING:
        return
    preempted = record.interrupt is not None and record.interrupt[0] == InterruptCause.PREEMPTED
    # preempted_by outlives a pause asked for meanwhile (it is cleared with the attempt):
    # the preemptor still waits for this victim and must not choose another.
    deps.state.interrupting[record.job_id] = record.preempted_by
    if record.interrupt is not None and not (preempted and record.interrupt_sent):
        # Only preemptions note that their InterruptJob went out: any other interrupt
        # is sent again at start (same event id; the launcher answers a repeat in kind).
        deps.unsent_interrupts.add(record.job_id)


async def announce_placed(deps: Deps, allocation: Allocation) -> None:
    attempt = deps.attempts.get(allocation.job_id, FIRST_ATTEMPT)
    await publish(deps, JobPlaced(
        event_id=placed_id(allocation.job_id, attempt),
        job_id=allocation.job_id,
        attempt=attempt,
        # A job placed with part of its tasks runs as submitted: the others follow.
        spec=deps.ungang.get(allocation.job_id, allocation.spec),
        tasks=list(allocation.tasks),
        retries_used=deps.retries_used.get(allocation.job_id, attempt - 1),
    ))  # fmt: skip
    await deps.store.mark_placed_published(allocation.job_id)
    deps.unannounced.discard(allocation.job_id)


async def announce_tasks(deps: Deps, job_id: str) -> None:
    """TasksPlaced with every task the job's attempt holds now (after its JobPlaced)."""
    allocation = deps.state.placed.get(job_id)
    if allocation is not None and job_id not in deps.unannounced:
        attempt = deps.attempts.get(job_id, FIRST_ATTEMPT)
        # Counted in tasks ever placed: a task given back and another placed is news.
        placed = len(allocation.tasks) + len(deps.released.get(job_id, ()))
        await publish(deps, TasksPlaced(
            event_id=derived_id(job_id, attempt, "tasks", placed),
            job_id=job_id, attempt=attempt, tasks=list(allocation.tasks),
        ))  # fmt: skip
    deps.unannounced_tasks.discard(job_id)


_BEHIND = re.compile(r"^waiting behind (?:job \S+|another user's job) at the head of ")


def notice_key(reasons: tuple[str, ...], position: int) -> NoticeKey:
    """What must change for a waiting job to be told again (a new JobQueued): its own
    reasons, but not which job happens to head its queue (every job behind a head would
    be told again each time the head changes: quadratic in the queue), and the order of
    magnitude of its position (1, 2-10, 11-100, ...: each job crosses a handful of those
    on its way to the head, not one per job placed ahead of it). The queue view shows the
    exact position and the current head at any time."""
    return _kinds(reasons), 0 if position <= 1 else math.ceil(math.log10(position))


@functools.lru_cache(maxsize=1024)
def _kinds(reasons: tuple[str, ...]) -> tuple[str, ...]:
    # Every job behind one head has the same reasons: one rewrite per cycle, not per job.
    return tuple(_BEHIND.sub("waiting behind the head of ", reason) for reason in reasons)


async def announce_stopped_in_queue(deps: Deps, record: JobRecord) -> None:
    await announce_stopped(deps, record.job_id, record.attempt, "stopped while queued")


def forget_queued(deps: Deps, job_id: str) -> None:
    deps.state.dequeue(job_id)
    deps.deferred.pop(job_id, None)
    deps.notices.pop(job_id, None)
    deps.waiting.pop(job_id, None)


async def reload_job(deps: Deps, job_id: str) -> None:
    forget_queued(deps, job_id)
    deps.state.release(job_id)
    deps.attempts.pop(job_id, None)
    deps.retries_used.pop(job_id, None)
    deps.unannounced.discard(job_id)
    record = await deps.store.get(job_id)
    if record is not None:
        adopt_record(deps, record)


def adopt_record(deps: Deps, record: JobRecord) -> None:
    if record.spec is None:
        return
    if record.state in ACTIVE_STATES:
        deps.retries_used[record.job_id] = record.retries_used
    if record.state == P.QUEUED:
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
        adopt_preemption(deps, record)
    elif record.state in (P.PLACED, P.INTERRUPTING):
        if not record.spec.gang:
            deps.ungang[record.job_id] = record.spec
            deps.released[record.job_id] = frozenset(record.released)
            # Tasks it got after its start may not have been announced: again (the
            # launcher and status take a repeat as nothing new).
            deps.unannounced_tasks.add(record.job_id)
        # An interrupting job holds its allocation until the launcher lets it go.
        deps.state.commit(
            Allocation(record.job_id, record.spec, record.allocation),
            placed_at=record.placed_at.timestamp() if record.placed_at else None,
        )
        adopt_preemption(deps, record)
        deps.attempts[record.job_id] = record.attempt
        if not record.placed_published:
            deps.unannounced.add(record.job_id)
