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
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    Event,
    InterruptCause,
    InterruptJob,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRetrying,
    JobState,
    StopJob,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.secrets_box import SecretBox, SecretsUnavailable, open_value
from trainyard_common.telemetry import continue_trace, current_traceparent

from .adapters.backend import (
    AlreadyLaunched,
    AttemptEnd,
    AttemptSpec,
    LaunchError,
    LaunchRefused,
    PortClaim,
    PortUnavailable,
    TaskBackend,
    TaskHandle,
    TaskLaunch,
    TaskOptions,
    TaskRef,
    TaskStatus,
)
from .adapters.store import (
    JOB_FINISHED,
    JOB_RUNNING,
    JOB_STOP_EARLY,
    JobRecord,
    LauncherStore,
    TaskRecord,
    Transition,
    new_task,
    now_ms,
)
from .domain.completion import TaskOutcome, Verdict, decide, exit_reason
from .domain.containers import container_command_line
from .domain.env import build_task_env, substitute_secrets
from .domain.failure import BACKOFF_BASE_S, EndKind, classify, judge, preparation_kind
from .domain.frameworks import framework_command
from .domain.lifecycle import (
    DEBUG_REASON,
    CleanupView,
    StartView,
    is_debug,
    late_tasks,
    plan_cleanup,
    start_deadline,
    start_deadline_reason,
)
from .domain.prepare import deadline_reason, debug_env_text, debug_reason, run_deadline

log = logging.getLogger("trainyard.launcher")

STOPPED_BEFORE_START = "stopped before it started"
LOST_WHILE_STARTING = "lost while starting: launched before, but the task never recorded its pid"
LOST_WHILE_DOWN = "lost while the launcher was down"
LOST = "lost: the task's process is gone and left no exit record"


@dataclass
class Deps:
    store: LauncherStore
    backend: TaskBackend
    publish: Callable[[Event], Awaitable[Any]]
    default_fs_uri: str = ""
    kill_grace_s: float = 10.0
    # How long a task launched by an earlier run gets to show its pid file.
    start_wait_s: float = 3.0
    # Tasks the watcher polls, by task id (an index of the store's RUNNING tasks).
    watching: dict[str, TaskRecord] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Seconds in a "minute" of max_running_minutes (YARD_LAUNCHER_MINUTE_S, for tests).
    minute_s: float = 60.0
    # Each watched job's run deadline (None: none), computed once from stored times.
    deadlines: dict[tuple[str, int], datetime | None] = field(default_factory=dict)
    # The first backoff between attempts (YARD_RETRY_BACKOFF_S; doubles per attempt).
    retry_backoff_s: float = BACKOFF_BASE_S
    # Every task must run its command this long after the attempt was placed
    # (YARD_START_DEADLINE_S; 0: no deadline). Attempts known to have started all.
    start_deadline_s: float = 600.0
    # Opens the job's sealed secrets (YARD_SECRETS_KEY); None: they come in clear.
    box: SecretBox | None = None
    # Each watched attempt's start deadline (None: all its tasks started, or no limit).
    start_deadlines: dict[tuple[str, int], datetime | None] = field(default_factory=dict)
    # Attempts a task of which ended but whose completion rules were not yet applied
    # (the store or the bus failed in between): the watcher applies them again until
    # that succeeds, since the ended task is no longer watched to remind it.
    unsettled: set[tuple[str, int]] = field(default_factory=set)
    # What time it is, to the store's precision (tests pass a clock they move instead of
    # sleeping).
    clock: Callable[[], datetime] = now_ms

    def lock(self, job_id: str) -> asyncio.Lock:
        return self.locks.setdefault(job_id, asyncio.Lock())


def task_ref(task: TaskRecord) -> TaskRef:
    return TaskRef(task.job_id, task.attempt, task.role, task.index)


def handle_of(task: TaskRecord) -> TaskHandle:
    return TaskHandle(pid=task.pid, start_ticks=task.start_ticks, uid=task.uid)


def attempt_of(job: JobRecord) -> AttemptSpec:
    assert job.spec is not None
    return AttemptSpec(job.job_id, job.attempt, job.spec, tuple(job.tasks))


def task_event(task: TaskRecord, step: Transition) -> TaskStateChanged:
    return TaskStateChanged(
        event_id=derived_id(task.job_id, task.attempt, task.role, task.index, step.seq),
        job_id=task.job_id,
        occurred_at=step.at,
        attempt=task.attempt,
        role=task.role,
        index=task.index,
        state=step.state,
        seq=step.seq,
        node=task.node,
        exit_code=step.exit_code,
        reason=step.reason,
        failure_class=step.failure_class,
    )


def finished_event(job: JobRecord) -> JobFinished:
    assert job.verdict is not None
    return JobFinished(
        event_id=derived_id(job.job_id, job.attempt, "finished"),
        job_id=job.job_id,
        attempt=job.attempt,
        state=job.verdict.state,
        reason=job.verdict.reason,
        exit_code=job.verdict.exit_code,
        failure_class=job.verdict.failure_class,
    )


def retrying_event(job: JobRecord) -> JobRetrying:
    assert job.retry is not None and job.retry.not_before is not None
    return JobRetrying(
        event_id=derived_id(job.job_id, job.attempt, "retry"),
        job_id=job.job_id,
        # When the retry was decided (stored), so a re-publish is the same event.
        occurred_at=job.retry.not_before - timedelta(seconds=job.retry.backoff_s),
        attempt=job.retry.attempt,
        previous_attempt=job.attempt,
        reason=job.retry.reason,
        failure_class=job.retry.failure_class,
        not_before=job.retry.not_before,
    )


def interrupted_event(job: JobRecord) -> JobInterrupted:
    assert job.interrupt is not None
    cause, reason = job.interrupt
    return JobInterrupted(
        event_id=derived_id(job.job_id, job.attempt, "interrupted"),
        job_id=job.job_id,
        attempt=job.attempt,
        cause=InterruptCause(cause),
        reason=reason,
    )


def end_event(job: JobRecord) -> JobFinished | JobRetrying | JobInterrupted:
    """What ends this attempt on the bus: the job's end, its next attempt, or an
    interruption (placement decides what follows)."""
    if job.interrupt is not None:
        return interrupted_event(job)
    return retrying_event(job) if job.retry is not None else finished_event(job)


async def publish_pending(deps: Deps, task: TaskRecord) -> TaskRecord:
    """Publish the task's stored but unpublished transitions; returns the record as it
    stands after that."""
    with continue_trace(task.traceparent):
        for step in task.unpublished():
            await deps.publish(task_event(task, step))
    if not task.outbox:
        return task
    await deps.store.mark_published(task.id, task.seq)
    return dataclasses.replace(task, published_seq=task.seq, outbox=False)


async def record(
    deps: Deps, task: TaskRecord, state: TaskState, **fields: Any
) -> TaskRecord | None:
    """Store a transition, then publish it; None when the task moved on meanwhile."""
    new = await deps.store.transition(task, state, **fields)
    if new is None:
        return None
    return await publish_pending(deps, new)


# --- launching ------------------------------------------------------------------------


async def launch_job(event: JobPlaced, deps: Deps) -> None:
    async with deps.lock(event.job_id):
        job = await _job_for(event, deps)
        if job is None:
            return
        if job.state == JOB_FINISHED:
            if not job.finished_published:
                await finish_job(deps, job)
            return

        started: list[tuple[TaskRecord, TaskPlacement]] = []
        # Every task is recorded STARTING before any is spawned, so ending the job
        # early (a task that cannot start) finds and stops all of them.
        for placement in event.tasks:
            ref = TaskRef(event.job_id, event.attempt, placement.role, placement.index)
            task = new_task(
                event.job_id,
                event.attempt,
                placement.role,
                placement.index,
                deps.backend.location(ref, event.spec),
                placement.node,
                traceparent=current_traceparent(),
            )
            if not await deps.store.insert_task(task):
                task = await deps.store.get_task(task.id) or task
            started.append((await publish_pending(deps, task), placement))
        if any(task.state == TaskState.STARTING for task, _ in started):
            # What the attempt's tasks share (a Service, an owner object) comes first.
            await deps.backend.open_attempt(attempt_of(job))

        for task, placement in started:
            if task.state == TaskState.STARTING:
                task = await start_task(deps, job, task, placement) or task
            if task.state == TaskState.RUNNING:
                deps.watching[task.id] = task
            elif task.state == TaskState.FAILED and await evaluate_job(
                deps, job.job_id, job.attempt
            ):
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


def _placement(job: JobRecord, task: TaskRecord) -> TaskPlacement | None:
    return next((p for p in job.tasks if p.role == task.role and p.index == task.index), None)


async def start_task(
    deps: Deps, job: JobRecord, task: TaskRecord, placement: TaskPlacement | None
) -> TaskRecord | None:
    """STARTING → RUNNING (or FAILED); never spawns a task that was spawned before."""
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
                **_failure(EndKind.START_FAILED),
            )
        try:
            launched = await deps.backend.launch(task_launch(deps, job, ref, placement))
        except AlreadyLaunched:
            launched = None
        except LaunchRefused as exc:
            reason = await _kept_for_debug(deps, job, task, f"could not start: {exc}")
            return await record(
                deps,
                task,
                TaskState.FAILED,
                reason=reason,
                ended_at=time.time(),
                **_failure(EndKind.UNSUPPORTED),
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
                **_failure(kind),
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
                **_failure(EndKind.LOST),
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


def task_launch(
    deps: Deps, job: JobRecord, ref: TaskRef, placement: TaskPlacement | None = None
) -> TaskLaunch:
    """What the backend needs to start the task (or to know what it got): its
    environment, its command, its ports. Pure but for the backend's addressing and the
    port it may reserve for the attempt."""
    attempt = attempt_of(job)
    spec = attempt.spec
    tasks = list(deps.backend.addressed(attempt))
    if placement is None:
        placement = next(p for p in job.tasks if (p.role, p.index) == (ref.role, ref.index))
    framework = deps.backend.framework_context(ref, attempt)
    env = build_task_env(
        spec, tasks, ref.role, ref.index, ref.attempt, ref.job_id, deps.default_fs_uri, framework
    )
    role = spec.role(ref.role)
    try:
        # Sealed by intake for this job; in clear only here, at launch.
        secrets = {s.name: open_value(deps.box, s.value, ref.job_id) for s in spec.secrets}
    except SecretsUnavailable as exc:
        raise LaunchRefused(f"the job's secrets: {exc}") from exc
    command = role.command
    if role.container_form:
        # A container's argv, $(VAR) expanded from its environment as Kubernetes would.
        command = container_command_line(role, env)
    command = substitute_secrets(command, secrets)
    command = framework_command(spec, tasks, ref.role, ref.index, command, framework)
    claims = [
        PortClaim(a.label, placement.host_ip, port) for a in placement.ports for port in a.ports
    ]
    return TaskLaunch(
        ref=ref,
        attempt=attempt,
        placement=placement,
        env=env,
        command=command,
        ports=claims,
        options=TaskOptions(debug=is_debug(spec), resources=role.resources),
        secret_values=tuple(secrets.values()),
    )


async def _kept_for_debug(deps: Deps, job: JobRecord | None, task: TaskRecord, reason: str) -> str:
    """OpenPAI isDebug: a failed task's environment is written next to its kept
    directory, and the reason says where both are."""
    if job is None or job.spec is None or not job.spec.keep_failed_for_debug:
        return reason
    try:
        launch = task_launch(deps, job, task_ref(task))
    except (KeyError, OSError, StopIteration, LaunchError):
        return reason
    full = deps.backend.task_env(launch)
    try:
        path = await deps.backend.write_debug_env(
            task_ref(task), debug_env_text(full, list(launch.secret_values))
        )
    except OSError as exc:
        return f"{reason}; its environment could not be kept: {exc}"
    return debug_reason(reason, task.dir, path)


def task_full_env(deps: Deps, job: JobRecord, task: TaskRecord) -> dict[str, str]:
    """The environment the task's command got (the machine's, the task's, the prepared
    virtualenv's): for its debug env file and for commands run in it (exec)."""
    assert job.spec is not None
    try:
        launch = task_launch(deps, job, task_ref(task))
    except (KeyError, OSError, StopIteration, LaunchError):
        return {}
    return deps.backend.task_env(launch)


# --- ending ---------------------------------------------------------------------------


def _failure(
    kind: EndKind, exit_code: int | None = None, signal: int | None = None
) -> dict[str, Any]:
    """The fields that classify a failed end (domain/failure.py)."""
    return {"failure_class": classify(exit_code, signal, kind), "end_kind": kind.value}


_BACKEND_KINDS = frozenset(
    k.value
    for k in (
        EndKind.KILLED_BY_PLATFORM,
        EndKind.NODE_LOST,
        EndKind.START_FAILED,
        EndKind.UNSUPPORTED,
        EndKind.PREPARE_USER,
    )
)


def _end_of(status: TaskStatus, lost_reason: str) -> tuple[TaskState, dict[str, Any]]:
    ended_at = status.ended_at or time.time()
    if status.lost:
        return TaskState.FAILED, {
            "reason": lost_reason,
            "ended_at": ended_at,
            **_failure(EndKind.LOST),
        }
    fields = {
        "exit_code": status.exit_code,
        "signal": status.signal,
        "reason": status.reason or exit_reason(status.exit_code, status.signal),
        "ended_at": ended_at,
    }
    ok = status.exit_code == 0 and not status.signal and status.end_kind is None
    if ok:
        return TaskState.SUCCEEDED, fields
    if status.end_kind in _BACKEND_KINDS:
        # The backend knows how it ended (a pod evicted, its node gone, its image not
        # pullable, its preparation refused): the reason is the backend's.
        kind = EndKind(status.end_kind)
        return TaskState.FAILED, {**fields, **_failure(kind, status.exit_code, status.signal)}
    if status.end_kind == EndKind.OUT_OF_MEMORY.value:
        fields["reason"] = f"{exit_reason(status.exit_code, status.signal)}; {status.reason}"
        return TaskState.FAILED, {
            **fields,
            **_failure(EndKind.OUT_OF_MEMORY, status.exit_code, status.signal),
        }
    # The wrapper gives a reason only when the preparation failed (the command never ran).
    kind = (
        preparation_kind(status.reason) if status.reason and not status.signal else EndKind.EXITED
    )
    return TaskState.FAILED, {**fields, **_failure(kind, status.exit_code, status.signal)}


async def end_task(deps: Deps, task_id: str, status: TaskStatus, lost_reason: str = LOST) -> None:
    task = await deps.store.get_task(task_id)
    if task is not None and not task.state.terminal:
        state, fields = _end_of(status, lost_reason)
        if state == TaskState.FAILED:
            job = await deps.store.get_job(task.job_id)
            fields["reason"] = await _kept_for_debug(deps, job, task, fields["reason"])
        await record(deps, task, state, **fields)
    deps.watching.pop(task_id, None)


async def evaluate_job(deps: Deps, job_id: str, attempt: int) -> bool:
    """Apply the completion rules; True when the job has ended (now or before)."""
    job = await deps.store.get_job(job_id)
    if job is None or job.attempt != attempt:
        return False
    if job.state == JOB_FINISHED:
        if not job.finished_published:
            await finish_job(deps, job)
        return True
    if job.state != JOB_RUNNING or job.spec is None:
        return False
    outcomes = _outcomes(await deps.store.tasks_of(job_id, attempt))
    verdict = decide(job.spec, outcomes)
    if verdict is None:
        return False
    await _finish_with(deps, job, verdict, outcomes)
    return True


def _outcomes(tasks: list[TaskRecord]) -> dict[tuple[str, int], TaskOutcome]:
    return {
        (t.role, t.index): TaskOutcome(
            t.state, t.exit_code, t.reason, t.ended_at, t.signal, t.failure_class, t.end_kind
        )
        for t in tasks
    }


async def _finish_with(
    deps: Deps,
    job: JobRecord,
    verdict: Verdict,
    outcomes: dict[tuple[str, int], TaskOutcome] | None = None,
) -> None:
    """Store the attempt's end (and, for a failure that runs again, its retry), then
    publish it. A retry's not_before is fixed here, once, so a re-publish is the same."""
    retry = None
    if verdict.state == JobState.FAILED and job.spec is not None:
        if outcomes is None:
            outcomes = _outcomes(await deps.store.tasks_of(job.job_id, job.attempt))
        # Attempts started by a pause, a preemption or a scale spent no retry.
        verdict, retry = judge(
            job.spec,
            job.attempt,
            verdict,
            outcomes,
            now=deps.clock(),
            base_s=deps.retry_backoff_s,
            retries_used=job.retries_used,
        )
    if await deps.store.set_verdict(job.job_id, job.attempt, verdict, retry):
        job = dataclasses.replace(job, state=JOB_FINISHED, verdict=verdict, retry=retry)
    else:
        job = await deps.store.get_job(job.job_id) or job
    if job.state == JOB_FINISHED and not job.finished_published:
        await finish_job(deps, job)


async def finish_job(deps: Deps, job: JobRecord) -> None:
    """Stop what still runs, then publish the stored verdict (again, after a crash)."""
    assert job.verdict is not None
    tasks = [t for t in await deps.store.tasks_of(job.job_id, job.attempt) if not t.state.terminal]
    if job.verdict.state == JobState.STOPPED:
        reason = job.verdict.reason
    elif job.retry is not None:
        reason = f"stopped because attempt {job.attempt} failed: {job.verdict.reason}"
    else:
        reason = f"stopped because the job ended: {job.verdict.reason}"

    async def stop_one(task: TaskRecord) -> None:
        ref = task_ref(task)
        handle = handle_of(task)
        if handle == TaskHandle() and await deps.backend.was_launched(ref):
            # Spawned by an earlier run that died before recording its handle.
            if (launched := await deps.backend.wait_started(ref, deps.start_wait_s)) is not None:
                handle = launched.handle
        status = await deps.backend.poll(ref, handle) if handle != TaskHandle() else None
        if status is not None and status.ended and not status.lost:
            await end_task(deps, task.id, status)  # it ended on its own meanwhile
            return
        status = await deps.backend.kill(ref, handle, deps.kill_grace_s)
        current: TaskRecord | None = task
        while current is not None and not current.state.terminal:
            if await record(
                deps,
                current,
                TaskState.STOPPED,
                exit_code=status.exit_code,
                signal=status.signal,
                reason=reason,
                ended_at=status.ended_at or time.time(),
            ):
                break
            current = await deps.store.get_task(task.id)
        deps.watching.pop(task.id, None)

    await asyncio.gather(*(stop_one(t) for t in tasks))
    if job.spec is not None:
        await deps.backend.close_attempt(attempt_of(job), attempt_end(job))
    await deps.publish(end_event(job))
    await deps.store.mark_finished_published(job.job_id, job.attempt)
    await clean_up(deps, job)


def attempt_end(job: JobRecord) -> AttemptEnd:
    if job.interrupt is not None:
        return AttemptEnd.INTERRUPTED
    if job.retry is not None:
        return AttemptEnd.RETRYING
    if job.verdict is not None and job.verdict.state == JobState.STOPPED:
        return AttemptEnd.STOPPED
    return AttemptEnd.FINISHED


async def clean_up(deps: Deps, job: JobRecord) -> None:
    """The job's clean-up policy, once the attempt's tasks have ended (the logs stay)."""
    if job.spec is None or job.interrupt is not None:
        return  # an interrupted attempt (pause, preemption, scale) keeps its directories
    tasks = await deps.store.tasks_of(job.job_id, job.attempt)
    plan = plan_cleanup(
        job.spec.cleanup_policy,
        job.spec.keep_failed_for_debug,
        [CleanupView(t.role, t.index, t.state) for t in tasks],
        job_ended=job.retry is None,
    )
    for role, index in plan.tasks:
        removed = await deps.backend.clean_task(TaskRef(job.job_id, job.attempt, role, index))
        log.info(
            "clean-up %s of %s: removed %s of %s[%d]",
            job.spec.cleanup_policy,
            job.job_id,
            ", ".join(removed) or "nothing",
            role,
            index,
        )
    if plan.job_venv and await deps.backend.clean_job(job.job_id):
        log.info("clean-up All of %s: removed the job's virtualenv", job.job_id)


# --- stopping -------------------------------------------------------------------------


async def stop_job(command: StopJob, deps: Deps) -> None:
    async with deps.lock(command.job_id):
        job = await deps.store.get_job(command.job_id)
        if job is None:
            # Not placed here yet: leave a tombstone for the JobPlaced that may follow.
            if await deps.store.insert_tombstone(command.job_id, command.reason):
                return
            job = await deps.store.get_job(command.job_id)
            assert job is not None
        if job.state == JOB_STOP_EARLY:
            return
        if job.state == JOB_FINISHED:
            if not job.finished_published:
                await finish_job(deps, job)
            if job.retry is not None or job.interrupt is not None:
                # Between attempts: placement stops a queued retry itself, but the next
                # attempt may already be placed; it must not start.
                await deps.store.note_stop(job.job_id, job.attempt, command.reason)
            return
        await _finish_with(deps, job, Verdict(JobState.STOPPED, command.reason))


# --- interrupting ---------------------------------------------------------------------


async def interrupt_job(command: InterruptJob, deps: Deps) -> None:
    """Placement takes this attempt's capacity back (a pause, a preemption, a scale): its
    tasks end as STOPPED with their directories kept, the attempt is finished as
    interrupted — not judged, so no retry is spent and no JobFinished follows — and
    JobInterrupted (stored first, so a restart publishes it again) answers."""
    async with deps.lock(command.job_id):
        job = await deps.store.get_job(command.job_id)
        if job is None or job.state == JOB_STOP_EARLY or job.attempt < command.attempt:
            # Placement announces an attempt before it interrupts it: the JobPlaced is
            # still on its way (or was put back for later); this waits for it.
            raise TransientError(
                f"attempt {command.attempt} of {command.job_id} is not known here yet"
            )
        if job.attempt > command.attempt:
            return  # an older attempt's interrupt
        if job.state == JOB_FINISHED:
            # Ended already (its own end, a stop, or this interrupt delivered again).
            if not job.finished_published:
                await finish_job(deps, job)
            return
        verdict = Verdict(JobState.STOPPED, command.reason)
        if await deps.store.set_interrupted(job.job_id, job.attempt, verdict, command.cause.value):
            job = dataclasses.replace(
                job,
                state=JOB_FINISHED,
                verdict=verdict,
                retry=None,
                interrupt=(command.cause.value, command.reason),
                finished_published=False,
            )
        else:
            job = await deps.store.get_job(job.job_id) or job
        if job.state == JOB_FINISHED and not job.finished_published:
            await finish_job(deps, job)


EVENT_HANDLERS: dict[type[Event], Callable[[Any, Deps], Awaitable[None]]] = {
    JobPlaced: launch_job,
    StopJob: stop_job,
    InterruptJob: interrupt_job,
}


async def dispatch(deps: Deps, event: Event, _delivery: Delivery | None = None) -> None:
    handler = EVENT_HANDLERS.get(type(event))
    if handler is not None:
        await handler(event, deps)


# --- watching and adopting ------------------------------------------------------------


async def check_tasks(deps: Deps) -> None:
    """One look at every watched task; record the ends and apply the rules."""
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
            with continue_trace(task.traceparent):
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
                await _finish_with(
                    deps,
                    job,
                    Verdict(JobState.FAILED, deadline_reason(job.spec.max_running_minutes)),
                )


async def check_start_deadlines(deps: Deps) -> None:
    """Fail the attempts whose tasks did not all start their command within
    ``start_deadline_s`` of the placement (a hung preparation, a task never spawned): the
    late tasks are stopped and FAILED as a platform failure, so a retry may follow."""
    if deps.start_deadline_s <= 0:
        return
    watched = {(t.job_id, t.attempt) for t in deps.watching.values()}
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
                continue
            tasks = await deps.store.tasks_of(job_id, attempt)
            late = late_tasks([await _start_view(deps, t) for t in tasks])
            if not late:
                deps.start_deadlines[(job_id, attempt)] = None  # all started: done
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
                        **_failure(EndKind.START_TIMEOUT),
                    )
                    deps.watching.pop(task.id, None)
                await _finish_with(
                    deps, job, Verdict(JobState.FAILED, reason, task=(late[0].role, late[0].index))
                )


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
            await check_deadlines(deps)
            await check_start_deadlines(deps)
        except Exception:  # noqa: BLE001 - a store hiccup must not end the watcher
            log.exception("checking tasks failed; trying again")
        changed = asyncio.ensure_future(deps.backend.changes(interval_s))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (changed, stopped):
                waiter.cancel()


async def adopt(deps: Deps) -> None:
    """At startup: take over the tasks the store says are starting or running, finish
    what was decided but not published, and publish transitions left in the outbox."""
    for task in await deps.store.unpublished_tasks():
        await publish_pending(deps, task)
    jobs: set[tuple[str, int]] = set()
    for task in await deps.store.active_tasks():
        jobs.add((task.job_id, task.attempt))
        async with deps.lock(task.job_id):
            job = await deps.store.get_job(task.job_id)
            if job is None or job.attempt != task.attempt or job.state != JOB_RUNNING:
                continue  # finished jobs: finish_job below stops their leftovers
            if task.state == TaskState.STARTING:
                # Started before the crash or not: start_task never spawns twice.
                new = await start_task(deps, job, task, _placement(job, task))
                if new is not None and new.state == TaskState.RUNNING:
                    deps.watching[new.id] = new
                continue
            status = await deps.backend.poll(task_ref(task), handle_of(task))
            if status.running:
                deps.watching[task.id] = task
            else:
                await end_task(deps, task.id, status, LOST_WHILE_DOWN)
    await _remove_strays(deps)
    # And every attempt still running with no task left active: a crash between a last
    # task's end and the job's verdict leaves one.
    jobs |= {(job.job_id, job.attempt) for job in await deps.store.running_jobs()}
    for job_id, attempt in sorted(jobs):
        async with deps.lock(job_id):
            await evaluate_job(deps, job_id, attempt)
    for job in await deps.store.unpublished_jobs():
        async with deps.lock(job.job_id):
            await finish_job(deps, job)
    log.info("adopted %d running task(s) of %d job(s)", len(deps.watching), len(jobs))


async def _remove_strays(deps: Deps) -> None:
    """Stop what the backend runs that the store does not know as running: a task a
    crash left behind, or a duplicate of one (the backend's inventory, where it keeps
    one: none is left behind, and no (job, attempt, role, index) runs twice)."""
    inventory = await deps.backend.inventory()
    if inventory is None:
        return
    for ref, handle in inventory.items():
        task = await deps.store.get_task(ref.key)
        known = task is not None and not task.state.terminal
        if known and task is not None and task.uid in (None, handle.uid):
            continue
        log.warning("stopping %s: the store does not know it as running", ref.key)
        await deps.backend.kill(ref, handle, deps.kill_grace_s)
