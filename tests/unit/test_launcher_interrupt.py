"""The launcher's side of an interrupt, over the in-memory store and a scripted backend:
InterruptJob ends the attempt's tasks as STOPPED without judging the attempt, then
JobInterrupted (never JobFinished or JobRetrying) answers under a derived id; the next
attempt starts with the retry budget placement says was spent."""

from __future__ import annotations

import pytest

from trainyard_common.errors import TransientError
from trainyard_common.events import (
    InterruptCause,
    InterruptJob,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRetrying,
    StopJob,
    TaskPlacement,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, RestartPolicy, RoleSpec
from trainyard_launcher.adapters.backend import TaskStatus
from trainyard_launcher.adapters.store import JOB_FINISHED
from trainyard_launcher.handlers import adopt, check_tasks, dispatch, launch_job

from ..support.bus import RECEIVED
from ..support.launcher import make_deps


def placed(attempt: int = 1, retry_limit: int = 1, retries_used: int | None = None) -> JobPlaced:
    spec = JobSpec(
        name="train",
        user="alice",
        retry_limit=retry_limit,
        roles=[
            RoleSpec(
                name="worker", replicas=2, command="run", restart_policy=RestartPolicy.ON_FAILURE
            )
        ],
    )
    tasks = [TaskPlacement(role="worker", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    return JobPlaced(
        event_id=derived_id("j1", attempt, "placed"),
        job_id="j1",
        attempt=attempt,
        spec=spec,
        tasks=tasks,
        retries_used=retries_used,
    )


def interrupt(attempt: int = 1, cause: InterruptCause = InterruptCause.PAUSED) -> InterruptJob:
    return InterruptJob(
        event_id=derived_id("j1", attempt, "interrupt", cause.value),
        job_id="j1",
        attempt=attempt,
        cause=cause,
        reason="paused by alice",
    )


def of(published, kind):
    return [e for e in published if isinstance(e, kind)]


async def test_an_interrupt_stops_the_tasks_and_answers_with_job_interrupted() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    await dispatch(deps, interrupt(), RECEIVED)
    assert sorted(backend.killed) == ["j1:1:worker:0", "j1:1:worker:1"]
    stopped = [e for e in of(published, TaskStateChanged) if e.state is TaskState.STOPPED]
    assert sorted((e.index, e.reason, e.failure_class) for e in stopped) == [
        (0, "paused by alice", None),
        (1, "paused by alice", None),
    ]
    [event] = of(published, JobInterrupted)
    assert event.event_id == derived_id("j1", 1, "interrupted")
    assert (event.attempt, event.cause, event.reason) == (
        1,
        InterruptCause.PAUSED,
        "paused by alice",
    )
    # Not judged: no end of the job, no retry.
    assert of(published, JobFinished) == [] and of(published, JobRetrying) == []
    job = await deps.store.get_job("j1")
    assert job is not None and job.state == JOB_FINISHED and job.finished_published
    assert job.interrupt == ("paused", "paused by alice")
    assert deps.watching == {}
    # Redelivered, and a late look at the tasks: nothing more.
    count = len(published)
    await dispatch(deps, interrupt(), RECEIVED)
    await check_tasks(deps)
    assert len(published) == count and len(backend.killed) == 2


async def test_an_interrupt_of_an_ended_or_older_attempt_is_ignored() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    backend.exit("j1", "worker", 0, 0)
    backend.exit("j1", "worker", 1, 0)
    await check_tasks(deps)
    [done] = of(published, JobFinished)
    await dispatch(deps, interrupt(), RECEIVED)
    assert of(published, JobInterrupted) == [] and backend.killed == []
    assert of(published, JobFinished) == [done]


async def test_an_interrupt_before_its_attempt_arrived_waits_for_it() -> None:
    deps, _, published = make_deps()
    with pytest.raises(TransientError):
        await dispatch(deps, interrupt(), RECEIVED)
    await launch_job(placed(), RECEIVED, deps)
    with pytest.raises(TransientError):
        await dispatch(deps, interrupt(attempt=2), RECEIVED)
    assert of(published, JobInterrupted) == []


async def test_the_next_attempt_after_an_interrupt_spends_no_retry() -> None:
    deps, backend, published = make_deps()
    deps.retry_backoff_s = 0.5
    await launch_job(placed(), RECEIVED, deps)
    await dispatch(deps, interrupt(), RECEIVED)
    # Placement queues attempt 2 with the budget untouched (retries_used 0 of 1).
    await launch_job(placed(attempt=2, retries_used=0), RECEIVED, deps)
    assert sorted(k for k, _, _ in backend.launches)[-2:] == ["j1:2:worker:0", "j1:2:worker:1"]
    backend.status["j1:2:worker:0"] = TaskStatus(running=False, exit_code=3, ended_at=1.0)
    await check_tasks(deps)
    [retry] = of(published, JobRetrying)
    assert (retry.previous_attempt, retry.attempt) == (2, 3)
    assert "retrying as attempt 3 of at most 3 after 0.5s" in retry.reason


async def test_without_retries_used_every_earlier_attempt_counts_as_a_retry() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    await dispatch(deps, interrupt(), RECEIVED)
    await launch_job(placed(attempt=2), RECEIVED, deps)  # an old placement: retries_used None
    backend.status["j1:2:worker:0"] = TaskStatus(running=False, exit_code=3, ended_at=1.0)
    await check_tasks(deps)
    assert of(published, JobRetrying) == []
    [done] = of(published, JobFinished)
    assert "the retry limit of 1 is used up" in done.reason


async def test_a_stop_after_an_interrupt_keeps_the_next_attempt_from_starting() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    await dispatch(deps, interrupt(cause=InterruptCause.PREEMPTED), RECEIVED)
    await dispatch(deps, StopJob(job_id="j1", requested_by="alice", reason="enough"), RECEIVED)
    launches = len(backend.launches)
    await launch_job(placed(attempt=2, retries_used=0), RECEIVED, deps)
    assert len(backend.launches) == launches
    [done] = of(published, JobFinished)
    assert (done.attempt, done.state.value, done.reason) == (2, "STOPPED", "enough")


async def test_an_interrupted_attempt_is_announced_after_a_crash() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)

    async def crash(event) -> None:
        raise ConnectionError("bus down")

    deps.publish = crash
    with pytest.raises(ConnectionError):
        await dispatch(deps, interrupt(), RECEIVED)
    job = await deps.store.get_job("j1")
    assert job is not None and job.interrupt is not None and not job.finished_published

    async def collect(event) -> None:
        published.append(event)

    deps.publish = collect
    deps.watching.clear()
    await adopt(deps)
    [event] = of(published, JobInterrupted)
    assert event.event_id == derived_id("j1", 1, "interrupted")
    assert of(published, JobFinished) == []
