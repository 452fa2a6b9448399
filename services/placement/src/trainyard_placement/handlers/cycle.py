"""The scheduling cycle: place what fits, preempt for what waits, tell a waiting job
why (only when that changes meaningfully), grow elastic jobs."""

from __future__ import annotations

import itertools
import logging
import time

from trainyard_common.events import (
    InterruptCause,
    JobQueued,
)
from trainyard_common.lifecycle import PlacementState as P

from ..adapters.metrics import CYCLE_SECONDS, DECISIONS
from ..adapters.store import (
    allocation_fields,
    interrupt_sent_fields,
    preempted_fields,
)
from ..domain import Allocation, Placed, Preempt, Waiting
from ..domain.growth import growth
from ..domain.partial import more_tasks
from .common import (
    FIRST_ATTEMPT,
    Deps,
    NoticeKey,
    announce_placed,
    announce_tasks,
    ensure_leading,
    interrupt_placed,
    notice_key,
    publish,
    queued_id,
    reload_job,
    send_interrupt,
)

log = logging.getLogger("trainyard.placement")


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
            if record is not None and record.state == P.PLACED:
                if await interrupt_placed(deps, record, InterruptCause.SHUTDOWN, SHUTDOWN_REASON):
                    interrupted.append(job_id)
        return interrupted


async def run_cycle(deps: Deps) -> None:
    """Place what fits now and tell waiting jobs why they wait. Call with the lock held.
    Inside a message's handler with cycles deferred, only noted: run_due_cycle runs it."""
    if deps.in_message:
        deps.cycle_due = True
        return
    began = time.perf_counter()
    try:
        await _cycle(deps)
    finally:
        CYCLE_SECONDS.observe(time.perf_counter() - began)


async def _cycle(deps: Deps) -> None:
    # 1. Announce placements a crash or a failed publish left unannounced.
    for job_id in sorted(deps.unannounced):
        await announce_placed(deps, deps.state.placed[job_id])
    for job_id in sorted(deps.unsent_interrupts):
        await _resend_interrupt(deps, job_id)
    for job_id in sorted(deps.unannounced_tasks):
        await announce_tasks(deps, job_id)
    if deps.draining:
        return  # shutting down: the next start places what waits
    # 1b. Jobs placed without gang placement take what fits of their waiting tasks,
    #     before the queue: they have started.
    await _place_more_tasks(deps)
    # 2. Decide, on a snapshot derived from the placed jobs' allocations; retries whose
    #    backoff ended join the queue first.
    now = deps.clock()
    for job_id, (job, not_before) in list(deps.deferred.items()):
        if not_before <= now:
            del deps.deferred[job_id]
            deps.state.enqueue(job)
    decisions = deps.state.cycle(now=now.timestamp())
    # 3. Store each placement, then take it into memory, then announce it; the next
    #    decisions already counted its capacity as used. A cycle that carried the last
    #    one on (only arrivals since) repeats its verdicts first: those were handled.
    carried = deps.state.carried if deps.waiting_handled else 0
    deps.waiting_handled = False
    queued: dict[str, Waiting] = deps.queue_waiting if carried else {}
    fresh: list[Waiting] = []
    for decision in itertools.islice(decisions, carried, None):
        if isinstance(decision, Placed):
            await _commit_placement(deps, decision)
        elif isinstance(decision, Preempt):
            await _preempt(deps, decision)
        else:
            queued[decision.job_id] = decision
            fresh.append(decision)
    deps.queue_waiting = queued
    waiting = dict(queued)
    deferred: list[Waiting] = []
    for job_id, (job, not_before) in sorted(deps.deferred.items(), key=lambda d: d[1][1]):
        waiting[job_id] = retrying = Waiting(
            job_id,
            len(waiting) + 1,
            (
                # Milliseconds, as the store keeps them: the same words after a restart.
                f"retrying attempt {job.attempt} after backoff until "
                f"{not_before.isoformat(timespec='milliseconds')}",
            ),
            job.attempt,
        )
        deferred.append(retrying)
    deps.waiting = waiting
    # 4. Explain the wait, only when the explanation changed.
    for decision in itertools.chain(fresh, deferred) if carried else waiting.values():
        if (notice := _notice_due(deps, decision)) is not None:
            await _notify_waiting(deps, decision, *notice)
    deps.waiting_handled = True
    # 5. Elastic jobs below their size grow into the free capacity: not while a job waits
    #    for capacity (growth says which waits block it: one waiting only for its own
    #    queue's quota blocks that queue alone), nor while a retry's backoff runs (it
    #    comes back for the capacity it had).
    if not deps.deferred:
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
        if record is None or record.state != P.PLACED or record.spec is None:
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
        if record is None or record.state != P.PLACED:
            if record is not None and record.state == P.INTERRUPTING:
                # Already on its way out: never chosen again. For another cause, or for
                # a preemption whose InterruptJob could not be sent (the store has whom
                # it is for, memory lost it with the failure; it goes out next cycle).
                if victim not in deps.state.interrupting:
                    deps.state.interrupting[victim] = record.preempted_by
                    if record.preempted_by is not None:
                        deps.state.preemptions[victim] = record.preemptions
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
            DECISIONS.labels("preempted").inc()
            await deps.store.change(
                victim,
                states=(P.INTERRUPTING,),
                attempt=record.attempt,
                fields=interrupt_sent_fields(),
            )


async def _resend_interrupt(deps: Deps, job_id: str) -> None:
    record = await deps.store.get(job_id)
    if record is not None and record.state == P.INTERRUPTING and record.interrupt is not None:
        if record.preempted_by is not None and job_id not in deps.state.interrupting:
            # A preemption whose send failed left memory without it: the preemptor waits
            # for this victim (and the victim is chosen by no one else), as at a restart.
            deps.state.interrupting[job_id] = record.preempted_by
            deps.state.preemptions[job_id] = record.preemptions
        await send_interrupt(deps, job_id, record.attempt, *record.interrupt)
        await deps.store.change(
            job_id, states=(P.INTERRUPTING,), attempt=record.attempt, fields=interrupt_sent_fields()
        )
    deps.unsent_interrupts.discard(job_id)  # only once sent: a failure sends it next cycle


async def _commit_placement(deps: Deps, decision: Placed) -> None:
    allocation = decision.allocation
    queued = deps.state.queued.get(allocation.job_id)
    ensure_leading(deps, f"the placement of job {allocation.job_id}")
    if not await deps.store.mark_placed(allocation.job_id, allocation.tasks):
        # Memory and store disagree (an update that landed but whose reply was lost,
        # or a second writer): the store wins.
        log.warning("job %s was not queued in the store; reloading it", allocation.job_id)
        await reload_job(deps, allocation.job_id)
        return
    if queued is not None and not queued.spec.gang:
        deps.ungang[allocation.job_id] = queued.spec
        deps.released[allocation.job_id] = frozenset()
    deps.state.commit(allocation, placed_at=deps.clock().timestamp())
    DECISIONS.labels("placed").inc()
    deps.attempts[allocation.job_id] = decision.attempt
    deps.notices.pop(allocation.job_id, None)
    deps.unannounced.add(allocation.job_id)
    await announce_placed(deps, allocation)


async def _place_more_tasks(deps: Deps) -> None:
    """Give each job placed without gang placement the waiting tasks that fit now
    (domain/partial.py), stored, then announced (TasksPlaced), oldest placement first."""
    state = deps.state
    for job_id in sorted(deps.ungang, key=lambda j: (state.placed_at.get(j, 0.0), j)):
        allocation = state.placed.get(job_id)
        if allocation is None:
            del deps.ungang[job_id]  # ended, or queued again: placed afresh later
            deps.released.pop(job_id, None)
            continue
        spec = deps.ungang[job_id]
        released = deps.released.get(job_id, frozenset())
        if job_id in deps.unannounced or len(allocation.tasks) + len(released) >= (
            spec.task_count()
        ):
            continue
        added = more_tasks(state, job_id, spec, allocation.tasks, released)
        if not added:
            continue
        tasks = (*allocation.tasks, *added)
        attempt = deps.attempts.get(job_id, FIRST_ATTEMPT)
        ensure_leading(deps, f"more tasks of job {job_id}")
        if not await deps.store.change(
            job_id, states=(P.PLACED,), attempt=attempt, fields=allocation_fields(tasks, released)
        ):
            log.warning("job %s was not placed in the store; reloading it", job_id)
            await reload_job(deps, job_id)
            continue
        state.commit(Allocation(job_id, spec, tasks), placed_at=state.placed_at.get(job_id))
        DECISIONS.labels("tasks_placed").inc()
        deps.unannounced_tasks.add(job_id)
        await announce_tasks(deps, job_id)


def _notice_due(deps: Deps, decision: Waiting) -> tuple[int, NoticeKey] | None:
    """The number and key of the notice a waiting job is due, or None when what it was
    last told still holds (a plain function: called for every waiting job each cycle,
    and most are due nothing)."""
    sent, last = deps.notices.get(decision.job_id, (0, None))
    key = notice_key(decision.reasons, decision.position)
    if key == last:
        return None
    if last is not None and last[1] < 0 and last[0] == key[0]:
        # Restored after a restart with its reasons but not its position: the same
        # reasons need no new notice; the position's class is known from now on.
        deps.notices[decision.job_id] = (sent, key)
        return None
    return sent + 1, key


async def _notify_waiting(deps: Deps, decision: Waiting, notice: int, key: NoticeKey) -> None:
    # Published before it is recorded: it is only information, and a crash in between
    # re-publishes the same id, which JetStream drops.
    await publish(deps, JobQueued(
        event_id=queued_id(decision.job_id, decision.attempt, notice, decision.reasons),
        job_id=decision.job_id,
        attempt=decision.attempt,
        position=decision.position,
        reasons=list(decision.reasons),
    ))  # fmt: skip
    await deps.store.note_reasons(decision.job_id, decision.reasons, notice)
    deps.notices[decision.job_id] = (notice, key)


async def run_due_cycle(deps: Deps) -> None:
    """The cycle the last batch of messages asked for, if any. A failure leaves it due:
    the next batch, or the next look (wake_retries), runs it again; every message's own
    effect is stored already."""
    if not deps.cycle_due or not deps.leading():
        return  # not leading: the next leader's own cycles place (it stays due here)
    async with deps.lock:
        if not deps.cycle_due or not deps.leading():
            return
        deps.cycle_due = False
        try:
            await run_cycle(deps)
        except Exception:
            deps.cycle_due = True
            raise
