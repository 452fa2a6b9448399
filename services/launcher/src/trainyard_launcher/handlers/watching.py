"""The watcher (task ends, run and start deadlines) and adoption after a restart."""

from __future__ import annotations

import asyncio
import logging
import time

from trainyard_common.events import (
    JobState,
    TaskState,
)
from trainyard_common.telemetry import continue_trace

from ..adapters.metrics import STRAYS, WATCHED
from ..adapters.store import (
    JOB_RUNNING,
    JobRecord,
    TaskRecord,
)
from ..domain.completion import Verdict
from ..domain.failure import EndKind
from ..domain.lifecycle import (
    StartView,
    late_tasks,
    start_deadline,
    start_deadline_reason,
)
from ..domain.prepare import deadline_reason, run_deadline
from .common import LOST_WHILE_DOWN, Deps, handle_of, publish_pending, record, task_ref
from .ending import end_task, evaluate_job, failure_of, finish_with
from .launching import placement_of, start_task

log = logging.getLogger("trainyard.launcher")

# How often the watcher publishes what the outbox holds, failures or not (seconds).
OUTBOX_SWEEP_S = 5.0


# --- watching and adopting ------------------------------------------------------------


async def drain_outbox(deps: Deps) -> None:
    """Publish the transitions stored but not published: the bus was down when they were
    made (a task's end recorded during a NATS outage). Without this they would wait for
    the launcher's next start, while the job's end went out without them."""
    for task in await deps.store.unpublished_tasks():
        lock = deps.lock(task.job_id)
        if lock.locked():
            continue  # its owner publishes it, or the next sweep does
        async with lock:
            current = await deps.store.get_task(task.id)
            if current is not None and current.outbox:
                await publish_pending(deps, current)


async def check_tasks(deps: Deps) -> None:
    """One look at every watched task; record the ends and apply the rules. After a
    failure (an unsettled attempt) and every OUTBOX_SWEEP_S, first the outbox, so a
    job's end is never published before its tasks' last transitions."""
    now = time.monotonic()
    if deps.unsettled or now - deps.outbox_swept >= OUTBOX_SWEEP_S:
        await drain_outbox(deps)
        deps.outbox_swept = now
    for job_id, attempt in sorted(deps.unsettled):
        lock = deps.lock(job_id)
        if lock.locked():
            continue
        async with lock:
            await evaluate_job(deps, job_id, attempt)
        deps.unsettled.discard((job_id, attempt))
    for key, task in list(deps.watching.items()):
        lock = deps.lock(task.job_id)
        if lock.locked():
            continue  # being launched or stopped right now; look again next round
        status = await deps.backend.poll(task_ref(task), handle_of(task))
        if status.running:
            continue
        async with lock:
            with continue_trace(task.traceparent, task.job_id):
                # Noted before the task leaves ``watching``: if what follows fails, the
                # next round still applies the rules (and publishes the job's end).
                deps.unsettled.add((task.job_id, task.attempt))
                await end_task(deps, key, status)
                await evaluate_job(deps, task.job_id, task.attempt)
                deps.unsettled.discard((task.job_id, task.attempt))


async def check_deadlines(deps: Deps) -> None:
    """Stop the watched jobs that ran past max_running_minutes. The deadline is read
    from the stored start times, so a restarted launcher keeps it."""
    watched = {(t.job_id, t.attempt) for t in deps.watching.values()}
    for key in set(deps.deadlines) - watched:
        del deps.deadlines[key]
    for job_id, attempt in watched:
        lock = deps.lock(job_id)
        if lock.locked():
            continue
        if (job_id, attempt) not in deps.deadlines:
            job = await deps.store.get_job(job_id)
            limit = job.spec.max_running_minutes if job and job.spec else None
            starts = [t.started for t in await deps.store.tasks_of(job_id, attempt) if t.started]
            deps.deadlines[(job_id, attempt)] = run_deadline(
                limit, min(starts, default=None), deps.minute_s
            )
        deadline = deps.deadlines[(job_id, attempt)]
        if deadline is None or deps.clock() < deadline:
            continue
        async with lock:
            job = await deps.store.get_job(job_id)
            if (
                job is None
                or job.attempt != attempt
                or job.state != JOB_RUNNING
                or job.spec is None
            ):
                continue
            assert job.spec.max_running_minutes is not None
            with continue_trace(
                next((t.traceparent for t in deps.watching.values() if t.job_id == job_id), None)
            ):
                await _finish_watched(
                    deps,
                    job,
                    Verdict(JobState.FAILED, deadline_reason(job.spec.max_running_minutes)),
                )


async def check_start_deadlines(deps: Deps) -> None:
    """Fail the attempts whose tasks did not all start their command within
    ``start_deadline_s`` of the placement (a hung preparation, a task never spawned): the
    late tasks are stopped and FAILED as a platform failure, so a retry may follow."""
    if deps.start_deadline_s <= 0:
        # No deadline: nothing to watch (an attempt whose launch raised for good, the
        # bus's deliveries spent, would stay in ``starting`` for the process's life).
        deps.starting.clear()
        return
    watched = {(t.job_id, t.attempt) for t in deps.watching.values()} | deps.starting
    for key in set(deps.start_deadlines) - watched:
        del deps.start_deadlines[key]
    for job_id, attempt in watched:
        lock = deps.lock(job_id)
        if lock.locked():
            continue
        if (job_id, attempt) not in deps.start_deadlines:
            # From the stored STARTING times, so a restarted launcher keeps the deadline.
            tasks = await deps.store.tasks_of(job_id, attempt)
            placed_at = min((t.transitions[0].at for t in tasks if t.transitions), default=None)
            if placed_at is None:
                # None recorded yet (a first try that failed before): next round, while
                # the attempt is still the job's running one.
                job = await deps.store.get_job(job_id)
                if job is None or job.attempt != attempt or job.state != JOB_RUNNING:
                    deps.starting.discard((job_id, attempt))
                continue
            deps.start_deadlines[(job_id, attempt)] = start_deadline(
                placed_at, deps.start_deadline_s
            )
        deadline = deps.start_deadlines[(job_id, attempt)]
        if deadline is None or deps.clock() < deadline:
            continue
        async with lock:
            job = await deps.store.get_job(job_id)
            if (
                job is None
                or job.attempt != attempt
                or job.state != JOB_RUNNING
                or job.spec is None
            ):
                deps.starting.discard((job_id, attempt))
                continue
            tasks = await deps.store.tasks_of(job_id, attempt)
            late = late_tasks([await _start_view(deps, t) for t in tasks])
            if not late:
                deps.start_deadlines[(job_id, attempt)] = None  # all started: done
                deps.starting.discard((job_id, attempt))
                continue
            reason = start_deadline_reason(deps.start_deadline_s, late)
            with continue_trace(tasks[0].traceparent if tasks else None):
                for view in late:
                    task = next(t for t in tasks if (t.role, t.index) == (view.role, view.index))
                    status = await deps.backend.kill(
                        task_ref(task), handle_of(task), deps.kill_grace_s
                    )
                    await record(
                        deps,
                        task,
                        TaskState.FAILED,
                        reason=reason,
                        exit_code=status.exit_code,
                        signal=status.signal,
                        ended_at=status.ended_at or time.time(),
                        **failure_of(EndKind.START_TIMEOUT),
                    )
                    deps.watching.pop(task.id, None)
                await _finish_watched(
                    deps, job, Verdict(JobState.FAILED, reason, task=(late[0].role, late[0].index))
                )
                deps.starting.discard((job_id, attempt))


async def _finish_watched(deps: Deps, job: JobRecord, verdict: Verdict) -> None:
    """``finish_with`` for an end the watcher decided. Noted as unsettled first: once the
    verdict is stored the job is no longer running, so no later deadline check looks at
    it again; if stopping its tasks or publishing its end fails, ``check_tasks`` finishes
    it (otherwise only the launcher's next start would)."""
    deps.unsettled.add((job.job_id, job.attempt))
    await finish_with(deps, job, verdict)
    deps.unsettled.discard((job.job_id, job.attempt))


async def _start_view(deps: Deps, task: TaskRecord) -> StartView:
    if task.state != TaskState.RUNNING:
        return StartView(task.role, task.index, task.state)
    progress = await deps.backend.progress(task_ref(task), handle_of(task))
    return StartView(task.role, task.index, task.state, progress.command_started, progress.step)


async def watch_tasks(deps: Deps, stop: asyncio.Event, interval_s: float = 0.3) -> None:
    """Look at the watched tasks whenever the backend says one may have changed, and at
    least every ``interval_s`` (deadlines are the watcher's own to notice)."""
    while not stop.is_set():
        try:
            await check_tasks(deps)
            await start_unstarted(deps)
            await remove_strays_again(deps)
            await check_deadlines(deps)
            await check_start_deadlines(deps)
        except Exception:  # noqa: BLE001 - a store hiccup must not end the watcher
            log.exception("checking tasks failed; trying again")
        WATCHED.set(len(deps.watching))
        changed = asyncio.ensure_future(deps.backend.changes(interval_s))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (changed, stopped):
                waiter.cancel()


async def adopt(deps: Deps) -> None:
    """At startup: take over the tasks the store says are starting or running, finish
    what was decided but not published, and publish transitions left in the outbox.

    What fails for a task, a job or the strays (the API server refusing a pod for now,
    a quota used up, the bus for a moment) does not stop the launcher from starting: it
    is logged and left to the watcher, which polls the task, starts it again
    (``start_unstarted``, under the start deadline), applies the job's rules again
    (``unsettled``) or stops the strays (``remove_strays_again``). Only a store that
    cannot be read at all (the tasks and jobs to adopt) stops it. A launcher that stopped here restarted into the same refusal, for
    as long as it lasted, watching nothing."""
    try:
        await drain_outbox(deps)
        drained = True
    except Exception:  # noqa: BLE001 - the watcher drains it, before any job's end
        log.exception("publishing the outbox at start failed; the watcher tries again")
        drained = False
    jobs: set[tuple[str, int]] = set()
    for task in await deps.store.active_tasks():
        jobs.add((task.job_id, task.attempt))
        try:
            async with deps.lock(task.job_id):
                await _adopt_task(deps, task)
        except Exception:  # noqa: BLE001 - one task's trouble must not stop the launcher
            log.exception("adopting task %s failed; the watcher tries again", task.id)
            if task.state == TaskState.STARTING:
                leave_unstarted(deps, task.job_id, task.attempt)
            else:
                deps.watching[task.id] = task  # polled again
    try:
        await _remove_strays(deps)
    except Exception:  # noqa: BLE001 - the watcher tries again (remove_strays_again)
        log.exception("stopping the tasks the store does not know failed; trying again")
        deps.strays_due = time.monotonic() + deps.start_retry_s
    # And every attempt still running with no task left active: a crash between a last
    # task's end and the job's verdict leaves one.
    jobs |= {(job.job_id, job.attempt) for job in await deps.store.running_jobs()}
    jobs |= {(job.job_id, job.attempt) for job in await deps.store.unpublished_jobs()}
    for job_id, attempt in sorted(jobs):
        if not drained:
            # A job's end must not go out before its tasks' last transitions: the
            # watcher drains the outbox first, then applies the rules.
            deps.unsettled.add((job_id, attempt))
            continue
        try:
            async with deps.lock(job_id):
                await evaluate_job(deps, job_id, attempt)
        except Exception:  # noqa: BLE001 - the watcher applies the rules again
            log.exception("judging job %s (attempt %d) failed; the watcher tries again",
                          job_id, attempt)  # fmt: skip
            deps.unsettled.add((job_id, attempt))
    log.info("adopted %d running task(s) of %d job(s)", len(deps.watching), len(jobs))


async def _adopt_task(deps: Deps, task: TaskRecord) -> None:
    job = await deps.store.get_job(task.job_id)
    if job is None or job.attempt != task.attempt or job.state != JOB_RUNNING:
        return  # finished jobs: finish_job in adopt stops their leftovers
    if task.state == TaskState.STARTING:
        # Started before the crash or not: start_task never spawns twice.
        new = await start_task(deps, job, task, placement_of(job, task))
        if new is not None and new.state == TaskState.RUNNING:
            deps.watching[new.id] = new
        return
    status = await deps.backend.poll(task_ref(task), handle_of(task))
    if status.running:
        deps.watching[task.id] = task
    else:
        await end_task(deps, task.id, status, LOST_WHILE_DOWN)


def leave_unstarted(deps: Deps, job_id: str, attempt: int) -> None:
    """An attempt with a task that could not be started now: the watcher starts it
    again later, and the start deadline fails it if that never succeeds."""
    deps.starting.add((job_id, attempt))
    deps.unstarted[(job_id, attempt)] = time.monotonic() + deps.start_retry_s


async def start_unstarted(deps: Deps) -> None:
    """Start again the tasks adoption left STARTING (``leave_unstarted``), once due;
    then apply the attempt's rules. What fails again waits ``start_retry_s`` more."""
    for key, due in sorted(deps.unstarted.items()):
        job_id, attempt = key
        lock = deps.lock(job_id)
        if due > time.monotonic() or lock.locked():
            continue
        async with lock:
            try:
                job = await deps.store.get_job(job_id)
                if job is not None and job.attempt == attempt and job.state == JOB_RUNNING:
                    for task in await deps.store.tasks_of(job_id, attempt):
                        if task.state != TaskState.STARTING:
                            continue
                        new = await start_task(deps, job, task, placement_of(job, task))
                        if new is not None and new.state == TaskState.RUNNING:
                            deps.watching[new.id] = new
                    await evaluate_job(deps, job_id, attempt)
            except Exception:  # noqa: BLE001 - still refused: later, the deadline runs
                log.warning("starting the tasks of job %s (attempt %d) failed again; "
                            "trying again in %.0f s", job_id, attempt, deps.start_retry_s,
                            exc_info=True)  # fmt: skip
                deps.unstarted[key] = time.monotonic() + deps.start_retry_s
                continue
            del deps.unstarted[key]


async def remove_strays_again(deps: Deps) -> None:
    """Where adoption could not stop the strays (the API server refusing for now), try
    again every ``start_retry_s`` until one whole pass succeeds: a duplicate left
    running holds GPUs placement has given to others."""
    if deps.strays_due is None or deps.strays_due > time.monotonic():
        return
    try:
        await _remove_strays(deps)
    except Exception:  # noqa: BLE001 - still refused: later
        log.warning("stopping the strays failed again; trying again in %.0f s",
                    deps.start_retry_s, exc_info=True)  # fmt: skip
        deps.strays_due = time.monotonic() + deps.start_retry_s
        return
    deps.strays_due = None


async def _remove_strays(deps: Deps) -> None:
    """Stop what the backend runs that the store does not know as running: a task a
    crash left behind, or a duplicate of one (the backend's inventory, where it keeps
    one: none is left behind, and no (job, attempt, role, index) runs twice). Each
    stray is tried (one refused does not leave the others running); the first error
    is raised at the end, for the pass to be made again."""
    inventory = await deps.backend.inventory()
    if inventory is None:
        return
    failed: Exception | None = None
    for ref, handle in inventory.items():
        try:
            task = await deps.store.get_task(ref.key)
            known = task is not None and not task.state.terminal
            if known and task is not None and task.uid in (None, handle.uid):
                continue
            log.warning("stopping %s: the store does not know it as running", ref.key)
            STRAYS.inc()
            await deps.backend.kill(ref, handle, deps.kill_grace_s)
        except Exception as exc:  # noqa: BLE001 - the others still; raised below
            failed = failed or exc
    if failed is not None:
        raise failed
