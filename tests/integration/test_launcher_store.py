"""The launcher's state store: the same contract on FerretDB and on the in-memory fake
(so the fake the handler tests use cannot drift)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from trainyard_common.events import FailureClass, JobState, TaskPlacement, TaskState
from trainyard_common.jobspec import EnvVar, JobSpec, RoleSpec
from trainyard_launcher.adapters.store import (
    JOB_FINISHED,
    JOB_RUNNING,
    JOB_STOP_EARLY,
    DocLauncherStore,
    JobRecord,
    LauncherStore,
    MemoryLauncherStore,
    new_task,
)
from trainyard_launcher.domain.completion import Verdict
from trainyard_launcher.domain.failure import Retry

from ..support.stores import REAL_STORES, store_client

SPEC = JobSpec(
    name="train",
    user="bob",
    env=[EnvVar(name="a.b", value="1"), EnvVar(name="$X", value="2")],
    roles=[RoleSpec(name="worker", replicas=2, command="python train.py")],
)
TASKS = [TaskPlacement(role="worker", index=i, node="n1", host_ip="127.0.0.1") for i in range(2)]


@pytest.fixture(params=["memory", *REAL_STORES])
async def store(request: pytest.FixtureRequest, db_prefix: str) -> AsyncIterator[LauncherStore]:
    if request.param == "memory":
        yield MemoryLauncherStore()
        return
    async with store_client(request, request.param, db_prefix) as client:
        store = DocLauncherStore(client[f"{db_prefix}_launcher"])
        await store.ensure_indexes()
        yield store


def running_job(attempt: int = 1) -> JobRecord:
    return JobRecord(
        job_id="j1", attempt=attempt, state=JOB_RUNNING, spec=SPEC, tasks=TASKS, user="bob"
    )


async def test_job_insert_once_and_round_trip(store: LauncherStore) -> None:
    assert await store.insert_job(running_job())
    assert not await store.insert_job(running_job())
    job = await store.get_job("j1")
    assert job == running_job()
    assert job is not None and job.spec is not None and job.spec.env[0].name == "a.b"
    assert await store.get_job("nope") is None


async def test_verdict_is_set_once_and_publishing_is_tracked(store: LauncherStore) -> None:
    await store.insert_job(running_job())
    verdict = Verdict(JobState.FAILED, "worker[1] failed", 3, ("worker", 1))
    assert await store.set_verdict("j1", 1, verdict)
    assert not await store.set_verdict("j1", 1, Verdict(JobState.STOPPED, "late stop"))
    assert not await store.set_verdict("j1", 2, verdict)
    job = await store.get_job("j1")
    assert job is not None
    assert (job.state, job.verdict, job.finished_published) == (JOB_FINISHED, verdict, False)
    assert [j.job_id for j in await store.unpublished_jobs()] == ["j1"]
    await store.mark_finished_published("j1", 1)
    assert await store.unpublished_jobs() == []
    assert await store.running_jobs() == []


async def test_running_jobs_are_those_without_a_verdict(store: LauncherStore) -> None:
    await store.insert_job(running_job())
    assert [(j.job_id, j.attempt) for j in await store.running_jobs()] == [("j1", 1)]
    assert await store.set_verdict("j1", 1, Verdict(JobState.SUCCEEDED, "done"))
    assert await store.running_jobs() == []


async def test_a_retry_is_stored_with_the_verdict_and_a_stop_may_follow(
    store: LauncherStore,
) -> None:
    await store.insert_job(running_job())
    verdict = Verdict(JobState.FAILED, "worker[0] failed", 1, ("worker", 0), FailureClass.USER)
    retry = Retry(
        2,
        10.0,
        "retrying as attempt 2",
        FailureClass.USER,
        datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC),
    )
    assert not await store.note_stop("j1", 1, "too early: still running")
    assert await store.set_verdict("j1", 1, verdict, retry)
    job = await store.get_job("j1")
    assert job is not None and (job.verdict, job.retry, job.stop_reason) == (verdict, retry, None)
    assert not await store.note_stop("j1", 2, "another attempt")
    assert await store.note_stop("j1", 1, "enough")
    assert (await store.get_job("j1")).stop_reason == "enough"  # type: ignore[union-attr]
    # The next attempt replaces the record: no verdict, no retry, no stop.
    assert await store.start_attempt(running_job(2), JOB_FINISHED, 1)
    job = await store.get_job("j1")
    assert job is not None and (job.attempt, job.retry, job.stop_reason) == (2, None, None)


async def test_a_failed_transition_keeps_its_class(store: LauncherStore) -> None:
    task = new_task("j1", 1, "worker", 0, "/tmp/t")
    assert await store.insert_task(task)
    failed = await store.transition(
        task, TaskState.FAILED, exit_code=127, failure_class=FailureClass.USER, end_kind="exited"
    )
    assert failed is not None
    stored = await store.get_task(task.id)
    assert stored is not None
    assert (stored.failure_class, stored.end_kind) == (FailureClass.USER, "exited")
    assert stored.transitions[-1].failure_class is FailureClass.USER
    assert stored.transitions[0].failure_class is None


async def test_tombstone_then_attempts(store: LauncherStore) -> None:
    assert await store.insert_tombstone("j1", "changed my mind")
    assert not await store.insert_tombstone("j1", "again")
    tomb = await store.get_job("j1")
    assert tomb is not None and (tomb.state, tomb.stop_reason, tomb.spec) == (
        JOB_STOP_EARLY,
        "changed my mind",
        None,
    )
    # Only from the state and attempt the caller read: a second writer loses.
    assert not await store.start_attempt(running_job(), JOB_RUNNING, 0)
    assert await store.start_attempt(running_job(), JOB_STOP_EARLY, 0)
    assert not await store.start_attempt(running_job(), JOB_STOP_EARLY, 0)
    job = await store.get_job("j1")
    assert job is not None and (job.state, job.attempt) == (JOB_RUNNING, 1)


async def test_task_transitions_are_guarded_by_seq(store: LauncherStore) -> None:
    task = new_task("j1", 1, "worker", 0, "/tmp/x", "n1")
    assert await store.insert_task(task)
    assert not await store.insert_task(task)
    stored = await store.get_task(task.id)
    assert stored == task
    assert [t.id for t in await store.unpublished_tasks()] == [task.id]
    await store.mark_published(task.id, 1)
    assert await store.unpublished_tasks() == []

    running = await store.transition(task, TaskState.RUNNING, pid=4242, start_ticks=99)
    assert running is not None and (running.seq, running.pid) == (2, 4242)
    # Another writer read the same seq 1: its transition must not happen.
    assert await store.transition(task, TaskState.FAILED, reason="late") is None
    ended = await store.transition(
        running, TaskState.SUCCEEDED, exit_code=0, reason="exited with code 0", ended_at=12.5
    )
    assert ended is not None
    again = await store.get_task(task.id)
    assert again is not None
    assert (again.state, again.seq, again.exit_code, again.ended_at) == (
        TaskState.SUCCEEDED,
        3,
        0,
        12.5,
    )
    assert [(t.seq, t.state) for t in again.transitions] == [
        (1, TaskState.STARTING),
        (2, TaskState.RUNNING),
        (3, TaskState.SUCCEEDED),
    ]
    assert [t.seq for t in again.unpublished()] == [2, 3]
    assert [t.id for t in await store.unpublished_tasks()] == [task.id]
    await store.mark_published(task.id, 2)  # not the latest: the outbox stays open
    assert [t.id for t in await store.unpublished_tasks()] == [task.id]
    await store.mark_published(task.id, 3)
    assert await store.unpublished_tasks() == []


async def test_active_tasks_and_tasks_of_a_job(store: LauncherStore) -> None:
    first = new_task("j1", 1, "worker", 0, "/d0")
    second = new_task("j1", 1, "worker", 1, "/d1")
    other = new_task("j2", 1, "worker", 0, "/d2")
    for task in (second, first, other):
        await store.insert_task(task)
    running = await store.transition(first, TaskState.RUNNING, pid=1)
    assert running is not None
    await store.transition(second, TaskState.FAILED, reason="could not start")
    assert [t.id for t in await store.tasks_of("j1", 1)] == [first.id, second.id]
    assert await store.tasks_of("j1", 2) == []
    assert sorted(t.id for t in await store.active_tasks()) == sorted([first.id, other.id])
