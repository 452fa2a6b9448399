"""Ending tasks and attempts: each task's end classified, the completion rules applied,
the verdict stored then published once, and what the attempt leaves cleaned up."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from trainyard_common.events import (
    JobState,
    TaskState,
)
from trainyard_common.jobspec import RETRY_ALWAYS

from ..adapters.backend import (
    AttemptEnd,
    LaunchError,
    TaskHandle,
    TaskRef,
    TaskStatus,
)
from ..adapters.store import (
    JOB_FINISHED,
    JOB_RUNNING,
    JobRecord,
    TaskRecord,
)
from ..domain.completion import TaskOutcome, Verdict, decide, exit_reason
from ..domain.failure import EndKind, classify, judge, preparation_kind
from ..domain.lifecycle import (
    CleanupView,
    plan_cleanup,
)
from ..domain.prepare import debug_env_text, debug_reason
from .common import (
    LOST,
    TRACER,
    Deps,
    attempt_of,
    end_event,
    handle_of,
    record,
    task_attributes,
    task_launch,
    task_ref,
)

log = logging.getLogger("trainyard.launcher")


# --- ending ---------------------------------------------------------------------------


def failure_of(
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
            **failure_of(EndKind.LOST),
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
        return TaskState.FAILED, {**fields, **failure_of(kind, status.exit_code, status.signal)}
    if status.end_kind == EndKind.OUT_OF_MEMORY.value:
        fields["reason"] = f"{exit_reason(status.exit_code, status.signal)}; {status.reason}"
        return TaskState.FAILED, {
            **fields,
            **failure_of(EndKind.OUT_OF_MEMORY, status.exit_code, status.signal),
        }
    # The wrapper gives a reason only when the preparation failed (the command never ran).
    kind = (
        preparation_kind(status.reason) if status.reason and not status.signal else EndKind.EXITED
    )
    return TaskState.FAILED, {**fields, **failure_of(kind, status.exit_code, status.signal)}


async def end_task(deps: Deps, task_id: str, status: TaskStatus, lost_reason: str = LOST) -> None:
    task = await deps.store.get_task(task_id)
    if task is not None and not task.state.terminal:
        state, fields = _end_of(status, lost_reason)
        # A span of the job's trace (the watcher continues it): "task end".
        with TRACER.start_as_current_span("task end", attributes=task_attributes(task)) as span:
            span.set_attribute("trainyard.task.state", state.value)
            if status.exit_code is not None:
                span.set_attribute("trainyard.task.exit_code", status.exit_code)
            if fields.get("failure_class"):
                span.set_attribute("trainyard.task.failure_class", str(fields["failure_class"]))
            if state == TaskState.FAILED:
                job = await deps.store.get_job(task.job_id)
                fields["reason"] = await kept_for_debug(deps, job, task, fields["reason"])
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
    await finish_with(deps, job, verdict, outcomes)
    return True


def _outcomes(tasks: list[TaskRecord]) -> dict[tuple[str, int], TaskOutcome]:
    return {
        (t.role, t.index): TaskOutcome(
            t.state, t.exit_code, t.reason, t.ended_at, t.signal, t.failure_class, t.end_kind
        )
        for t in tasks
    }


async def finish_with(
    deps: Deps,
    job: JobRecord,
    verdict: Verdict,
    outcomes: dict[tuple[str, int], TaskOutcome] | None = None,
) -> None:
    """Store the attempt's end (and, for a failure that runs again, its retry), then
    publish it. A retry's not_before is fixed here, once, so a re-publish is the same."""
    retry = None
    if job.spec is not None and (
        verdict.state == JobState.FAILED
        or (verdict.state == JobState.SUCCEEDED and job.spec.retry_limit == RETRY_ALWAYS)
    ):
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


async def kept_for_debug(deps: Deps, job: JobRecord | None, task: TaskRecord, reason: str) -> str:
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
