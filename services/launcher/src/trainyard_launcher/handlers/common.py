"""What every handler of the launcher shares: its dependencies, the events it builds
from its records, what a task is launched with, and storing-then-publishing a task
transition."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trainyard_common.events import (
    Event,
    InterruptCause,
    JobFinished,
    JobInterrupted,
    JobRetrying,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.limits import TooLong
from trainyard_common.secrets_box import SecretBox, SecretsUnavailable, open_value
from trainyard_common.telemetry import continue_trace, tracer

from ..adapters.backend import (
    AttemptSpec,
    LaunchError,
    LaunchRefused,
    PortClaim,
    TaskBackend,
    TaskHandle,
    TaskLaunch,
    TaskOptions,
    TaskRef,
)
from ..adapters.store import (
    JobRecord,
    LauncherStore,
    TaskRecord,
    Transition,
    now_ms,
)
from ..domain.containers import container_command_line
from ..domain.env import build_task_env, substitute_secrets
from ..domain.failure import BACKOFF_BASE_S
from ..domain.frameworks import framework_command
from ..domain.lifecycle import (
    is_debug,
)

log = logging.getLogger("trainyard.launcher")
TRACER = tracer("trainyard.launcher")


def task_attributes(task: TaskRecord) -> dict[str, str | int]:
    """What a task's spans say about it (they are in its job's trace)."""
    return {
        "trainyard.job_id": task.job_id,
        "trainyard.attempt": task.attempt,
        "trainyard.task.role": task.role,
        "trainyard.task.index": task.index,
    }


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
    locks: JobLocks = field(default_factory=lambda: JobLocks())
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
    # Attempts whose tasks were recorded STARTING here: the start deadline covers them
    # while none is watched yet (an attempt the backend would not open, its message
    # redelivered until the dead letters, held its placement for ever).
    starting: set[tuple[str, int]] = field(default_factory=set)
    # Attempts with a task adoption could not start (the API server refusing for now, a
    # quota used up, any error): when the watcher tries them again (time.monotonic()),
    # every ``start_retry_s``, while the start deadline runs.
    unstarted: dict[tuple[str, int], float] = field(default_factory=dict)
    start_retry_s: float = 5.0
    # When the watcher tries again to stop the tasks the store does not know as running
    # (time.monotonic()), where adoption's look failed; None: nothing left to do.
    strays_due: float | None = None
    # When the watcher last published what the outbox held (time.monotonic()).
    outbox_swept: float = 0.0
    # What time it is, to the store's precision (tests pass a clock they move instead of
    # sleeping).
    clock: Callable[[], datetime] = now_ms

    def lock(self, job_id: str) -> JobLock:
        return JobLock(self.locks, job_id)


class JobLocks:
    """One lock per job, kept only while a coroutine holds it or waits for it: a lock
    per job ever seen grew the launcher by some 400 bytes a job (bench/soak.py)."""

    def __init__(self) -> None:
        # job id: (its lock, how many hold it or wait for it)
        self._held: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def locked(self, job_id: str) -> bool:
        entry = self._held.get(job_id)
        return entry is not None and entry[0].locked()

    async def acquire(self, job_id: str) -> None:
        lock, users = self._held.get(job_id) or (asyncio.Lock(), 0)
        self._held[job_id] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting: no longer a user
            self._leave(job_id)
            raise

    def release(self, job_id: str) -> None:
        self._held[job_id][0].release()
        self._leave(job_id)

    def _leave(self, job_id: str) -> None:
        lock, users = self._held[job_id]
        if users == 1:
            del self._held[job_id]
        else:
            self._held[job_id] = (lock, users - 1)


class JobLock:
    """``async with deps.lock(job_id)``: one job's work at a time; ``locked()`` says
    whether someone is at it now (the watcher passes over such a job)."""

    def __init__(self, locks: JobLocks, job_id: str) -> None:
        self._locks = locks
        self._job_id = job_id

    def locked(self) -> bool:
        return self._locks.locked(self._job_id)

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._job_id)

    async def __aexit__(self, *exc: object) -> None:
        self._locks.release(self._job_id)


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
    with continue_trace(task.traceparent, task.job_id):
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
    try:
        written, command = command, substitute_secrets(command, secrets)
    except TooLong as exc:
        raise LaunchRefused(
            f"the command, its <% $secrets %> references substituted, comes to {exc} "
            "(a secret named many times)"
        ) from exc
    command = framework_command(spec, tasks, ref.role, ref.index, command, framework)
    # Whether any secret is in what runs (a wrapper may quote it, or run another
    # command in its place): the line as written, wrapped the same way, differs.
    carries_secrets = bool(secrets) and command != framework_command(
        spec, tasks, ref.role, ref.index, written, framework
    )
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
        carries_secrets=carries_secrets,
    )


def task_full_env(deps: Deps, job: JobRecord, task: TaskRecord) -> dict[str, str]:
    """The environment the task's command got (the machine's, the task's, the prepared
    virtualenv's): for its debug env file and for commands run in it (exec)."""
    assert job.spec is not None
    try:
        launch = task_launch(deps, job, task_ref(task))
    except (KeyError, OSError, StopIteration, LaunchError):
        return {}
    return deps.backend.task_env(launch)
