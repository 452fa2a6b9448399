"""The status projections against the real MongoDB-wire store: redelivered and late
events change nothing twice, history keeps stream order."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from fastapi import FastAPI
from httpx import ASGITransport, AsyncClient

from trainyard_common.auth import Identity
from trainyard_common.bus import Atomic, Bus
from trainyard_common.contracts import example_events
from trainyard_common.events import (
    InterruptCause,
    JobFinished,
    JobInterrupted,
    JobResourceChanged,
    JobState,
    SetPriority,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.jobspec import EnvVar
from trainyard_common.storage import Client, batch_writes, batching
from trainyard_common.subjects import ALL_EVENTS
from trainyard_status.adapters.views import JobViews, job_view
from trainyard_status.dialect_api import k8s_resources
from trainyard_status.dialect_api import openpai as openpai_api
from trainyard_status.dialect_api.context import StatusContext
from trainyard_status.domain.projection import project
from trainyard_status.handlers import project_event


@pytest.fixture
async def views(doc_client, db_prefix: str):
    views = JobViews(doc_client[f"{db_prefix}_status"])
    await views.ensure_indexes()
    return views


def lifecycle(job_id: str):
    """A job's events in stream order: submitted .. placed, two tasks run, job succeeds."""
    by_type = {type(e).__name__: e for e in example_events()}
    events = [
        by_type[n].model_copy(update={"job_id": job_id, "event_id": uuid.uuid4().hex})
        for n in ("JobSubmitted", "JobAccepted", "JobQueued", "JobPlaced")
    ]
    for index in range(2):
        for seq, state in enumerate(
            (TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED), 1
        ):
            events.append(
                TaskStateChanged(
                    job_id=job_id,
                    role="worker",
                    index=index,
                    state=state,
                    seq=seq,
                    node="node-0",
                    exit_code=0 if state.terminal else None,
                )
            )
    events.append(
        JobFinished(job_id=job_id, state=JobState.SUCCEEDED, reason="all tasks ended", exit_code=0)
    )
    return events


async def apply_all(views: JobViews, events, seqs) -> None:
    for event, seq in zip(events, seqs, strict=True):
        await views.record(event, seq, None)
        await views.apply(project(event), seq)


async def submitted_job(
    views: JobViews, seq: int, *, at_s: float, dialect: str | None = None, **spec: Any
) -> str:
    """A new job, only submitted, ``at_s`` seconds after the example's time; its id."""
    job = uuid.uuid4().hex
    event = lifecycle(job)[0]
    update: dict[str, Any] = {
        "spec": event.spec.model_copy(update=spec),
        "occurred_at": event.occurred_at + timedelta(seconds=at_s),
    }
    if dialect:
        update["dialect"] = dialect
    await apply_all(views, [event.model_copy(update=update)], [seq])
    return job


async def snapshot(views: JobViews, job_id: str) -> dict:
    doc = await views.get_job(job_id)
    view = job_view(doc, await views.job_tasks(job_id))
    view.pop("updated_at")
    for task in view["tasks"]:
        task.pop("updated_at")
    return view


async def test_in_order_projection(views: JobViews) -> None:
    job = uuid.uuid4().hex
    events = lifecycle(job)
    await apply_all(views, events, range(1, len(events) + 1))
    view = await snapshot(views, job)
    assert view["state"] == "SUCCEEDED" and view["exit_code"] == 0
    assert view["spec"]["name"] == "pi-estimate" and view["user"] == "alice"
    assert [(t["role"], t["index"], t["state"], t["node"]) for t in view["tasks"]] == [
        ("worker", 0, "SUCCEEDED", "node-0"),
        ("worker", 1, "SUCCEEDED", "node-0"),
    ]
    assert view["tasks"][0]["ports"] == [{"label": "http", "ports": [20100]}]
    history = await views.history(job)
    assert [h["type"] for h in history] == [type(e).__name__ for e in events]


async def test_redelivered_and_shuffled_events_give_the_same_view(views: JobViews) -> None:
    job_a, job_b = uuid.uuid4().hex, uuid.uuid4().hex
    events_a = lifecycle(job_a)
    await apply_all(views, events_a, range(1, len(events_a) + 1))
    # Job b gets the same events with every one delivered twice, in a shuffled order.
    events_b = [
        e.model_copy(update={"job_id": job_b, "event_id": uuid.uuid4().hex}) for e in events_a
    ]
    pairs = list(zip(events_b, range(1, len(events_b) + 1), strict=True)) * 2
    random.Random(7).shuffle(pairs)
    await apply_all(views, [p[0] for p in pairs], [p[1] for p in pairs])
    a, b = await snapshot(views, job_a), await snapshot(views, job_b)
    for key in ("state", "exit_code", "reason", "tasks", "spec"):
        assert a[key] == b[key], key
    assert len(await views.history(job_b)) == len(events_b)  # no duplicate history rows


async def test_an_event_applied_late_does_not_undo_a_later_one(views: JobViews) -> None:
    # Another status replica, or a message naked and redelivered after later ones: the
    # fields more than one kind of event sets keep the latest event's values.
    job = uuid.uuid4().hex
    submitted, accepted, queued, placed = lifecycle(job)[:4]
    role = accepted.spec.roles[0]
    defaulted = accepted.spec.model_copy(
        update={"roles": [role.model_copy(update={"image": "defaulted:1"})]}
    )
    accepted = accepted.model_copy(update={"spec": defaulted})
    scaled = placed.spec.model_copy(
        update={"roles": [role.model_copy(update={"image": "defaulted:1", "replicas": 5})]}
    )
    placed = placed.model_copy(update={"spec": scaled})

    def priority(value: int) -> SetPriority:
        return SetPriority(job_id=job, requested_by="alice", priority=value)

    def resource(generation: int) -> JobResourceChanged:
        body = {"metadata": {"name": "train", "labels": {"gen": str(generation)}}}
        return JobResourceChanged(job_id=job, resource=body, generation=generation)

    # In stream order: submitted 1, accepted 2, priority 9 at 3 then 7 at 4, resource
    # generation 2 at 5 then 3 at 6, queued 7, placed 8 (a new size); applied shuffled.
    order = [
        (accepted, 2), (priority(7), 4), (resource(3), 6), (placed, 8), (submitted, 1),
        (priority(9), 3), (resource(2), 5), (queued, 7), (accepted, 2),
    ]  # fmt: skip
    for event, seq in order:
        await views.apply(project(event), seq)
    doc = await views.get_job(job)
    assert doc["priority"] == 7
    assert doc["generation"] == 3 and '"gen": "3"' in doc["original_json"]
    spec = json.loads(doc["spec_json"])
    assert spec["roles"][0]["image"] == "defaulted:1" and spec["roles"][0]["replicas"] == 5
    assert doc["name"] == submitted.spec.name  # the submission's own fields, late too


def interrupted(job_id: str):
    """Submitted .. placed, one task running and one failed, then paused."""
    events = lifecycle(job_id)[:4]
    events += [
        TaskStateChanged(job_id=job_id, role="worker", index=0, state=TaskState.RUNNING, seq=2),
        TaskStateChanged(
            job_id=job_id, role="worker", index=1, state=TaskState.FAILED, seq=2, exit_code=1
        ),
        JobInterrupted(job_id=job_id, attempt=1, cause=InterruptCause.PAUSED, reason="paused"),
    ]
    return events


class Failed(Exception):
    pass


async def test_a_batch_stores_what_its_messages_one_at_a_time_store(
    views: JobViews, doc_client: Client, db_prefix: str
) -> None:
    """The status consumer's batches (one SQLite transaction; on MongoDB a unit of work
    sent as bulk writes, mongo_batch.py) against the same events applied one by one: the
    same views and history, with a redelivered copy of every event, shuffled, and two
    handlers failing after their writes (one after a write the batch had to send at
    once: the interrupt's update of the attempt's tasks), each delivered again later."""
    jobs = [uuid.uuid4().hex for _ in range(3)]
    events = [*lifecycle(jobs[0]), *lifecycle(jobs[1]), *interrupted(jobs[2])]
    deliveries = list(enumerate(events, 1)) * 2
    random.Random(11).shuffle(deliveries)
    failing = {
        next(i for i, (_, e) in enumerate(deliveries) if isinstance(e, JobInterrupted)),
        next(i for i, (_, e) in enumerate(deliveries) if type(e).__name__ == "JobPlaced"),
    }
    deliveries += [deliveries[i] for i in sorted(failing)]
    for seq, event in deliveries:
        await views.record(event, seq, None)
        await views.apply(project(event), seq)

    database = batching(doc_client[f"{db_prefix}_batched"])
    batched = JobViews(database)
    await batched.ensure_indexes()
    atomic = batch_writes(database)
    failures = 0
    async with atomic.transaction():
        for i, (seq, event) in enumerate(deliveries):
            try:
                async with atomic.savepoint():
                    await batched.record(event, seq, None)
                    await batched.apply(project(event), seq)
                    if i in failing:
                        raise Failed
            except Failed:
                failures += 1
    assert failures == 2
    for job in jobs:
        one, batch = await snapshot(views, job), await snapshot(batched, job)
        assert batch == one, job
        assert await batched.history(job) == await views.history(job)
    assert (await snapshot(batched, jobs[2]))["state"] == "PAUSED"
    assert [t["state"] for t in (await snapshot(batched, jobs[2]))["tasks"]] == [
        "STOPPED",
        "FAILED",
    ]


async def test_list_filters_and_pages_newest_first(views: JobViews) -> None:
    user = "u" + uuid.uuid4().hex[:6]
    ids = [await submitted_job(views, i + 1, at_s=i, user=user) for i in range(5)]
    items, total = await views.list_jobs(user=user, state=None, limit=2, offset=1)
    assert total == 5 and [i["id"] for i in items] == [ids[3], ids[2]]
    items, total = await views.list_jobs(user=user, state="RUNNING", limit=10, offset=0)
    assert total == 0 and items == []


async def test_two_attempts_shuffled_and_repeated_give_one_history_of_attempts(
    views: JobViews,
) -> None:
    """A retried job on the real store: the view ends in the last attempt whatever the
    order, every attempt's tasks stay, and each attempt's end is listed once."""
    from trainyard_common.events import FailureClass, JobQueued, JobRetrying

    by_type = {type(e).__name__: e for e in example_events()}

    def events_of(job: str) -> list:
        def task(attempt: int, seq: int, state: TaskState, **extra) -> TaskStateChanged:
            return TaskStateChanged(
                job_id=job, attempt=attempt, role="worker", index=0, seq=seq, state=state, **extra
            )

        retry: JobRetrying = by_type["JobRetrying"].model_copy(update={"job_id": job})
        return [
            *(
                by_type[n].model_copy(update={"job_id": job, "event_id": uuid.uuid4().hex})
                for n in ("JobSubmitted", "JobAccepted", "JobPlaced")
            ),
            task(1, 1, TaskState.STARTING),
            task(1, 2, TaskState.RUNNING),
            task(1, 3, TaskState.FAILED, exit_code=1, failure_class=FailureClass.USER),
            retry,
            JobQueued(job_id=job, attempt=2, reasons=["retrying attempt 2 after backoff"]),
            by_type["JobPlaced"].model_copy(
                update={"job_id": job, "attempt": 2, "event_id": uuid.uuid4().hex}
            ),
            task(2, 1, TaskState.STARTING),
            task(2, 2, TaskState.RUNNING),
            task(2, 3, TaskState.FAILED, exit_code=137, failure_class=FailureClass.UNKNOWN),
            JobFinished(
                job_id=job,
                attempt=2,
                state=JobState.FAILED,
                reason="gave up",
                exit_code=137,
                failure_class=FailureClass.UNKNOWN,
            ),
        ]

    job_a, job_b = uuid.uuid4().hex, uuid.uuid4().hex
    events_a = events_of(job_a)
    await apply_all(views, events_a, range(1, len(events_a) + 1))
    events_b = [e.model_copy(update={"job_id": job_b}) for e in events_a]
    pairs = list(zip(events_b, range(1, len(events_b) + 1), strict=True)) * 2
    random.Random(11).shuffle(pairs)
    await apply_all(views, [p[0] for p in pairs], [p[1] for p in pairs])
    a, b = await snapshot(views, job_a), await snapshot(views, job_b)
    assert (a["state"], a["attempt"], a["retries"], a["failure_class"]) == (
        "FAILED",
        2,
        1,
        "unknown",
    )
    assert [(x["attempt"], x["state"], x["failure_class"]) for x in a["attempts"]] == [
        (1, "FAILED", "platform"),
        (2, "FAILED", "unknown"),
    ]
    assert [(t["attempt"], t["state"], t["failure_class"]) for t in a["tasks"]] == [
        (1, "FAILED", "user"),
        (1, "PENDING", None),
        (2, "FAILED", "unknown"),
        (2, "PENDING", None),
    ]
    for key in ("state", "attempt", "retries", "attempts", "failure_class", "tasks", "exit_code"):
        assert a[key] == b[key], key

    # Before its end: attempt 2 is running, and a late event of attempt 1 changes nothing.
    job_c = uuid.uuid4().hex
    events_c = [e.model_copy(update={"job_id": job_c}) for e in events_a[:11]]
    await apply_all(views, events_c, range(1, 12))
    await apply_all(views, [events_c[4], events_c[2]], [5, 3])
    c = await snapshot(views, job_c)
    assert (c["state"], c["attempt"]) == ("RUNNING", 2), c


async def test_an_interrupt_stops_the_attempts_unended_tasks_in_the_view(views: JobViews) -> None:
    job = uuid.uuid4().hex
    events = lifecycle(job)[:4]  # submitted .. placed: two tasks
    events += [
        TaskStateChanged(job_id=job, role="worker", index=0, state=TaskState.RUNNING, seq=2),
        TaskStateChanged(
            job_id=job, role="worker", index=1, state=TaskState.FAILED, seq=2, exit_code=1
        ),
    ]
    events.append(
        JobInterrupted(job_id=job, attempt=1, cause=InterruptCause.PAUSED, reason="paused by alice")
    )
    await apply_all(views, events, range(1, len(events) + 1))
    view = await snapshot(views, job)
    assert view["state"] == "PAUSED" and view["reason"] == "paused by alice"
    assert [(t["index"], t["state"]) for t in view["tasks"]] == [(0, "STOPPED"), (1, "FAILED")]
    assert view["attempts"][0]["interrupted"] == "paused"
    # The launcher's own STOPPED transition still lands (a higher seq).
    await apply_all(
        views,
        [
            TaskStateChanged(
                job_id=job, role="worker", index=0, seq=3, state=TaskState.STOPPED, exit_code=143
            )
        ],
        [99],
    )
    view = await snapshot(views, job)
    assert view["tasks"][0]["exit_code"] == 143
    assert [h["type"] for h in await views.history(job)][-2] == "JobInterrupted"


async def test_the_consoles_filters_by_queue_dialect_name_prefix_and_time(views: JobViews) -> None:
    from datetime import UTC, datetime

    from trainyard_status.app import list_filters

    base = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    tag = uuid.uuid4().hex[:6]
    submitted = next(e for e in example_events() if type(e).__name__ == "JobSubmitted")
    jobs = {}
    for i, (queue, dialect, name) in enumerate(
        [("gpu", "openpai", "train-a"), ("gpu", "native", "train-b"), ("cpu", "openpai", "eval-a")]
    ):
        labels = [EnvVar(name="team", value="vision" if "train" in name else "nlp")]
        spec = submitted.spec.model_copy(
            update={"name": f"{tag}-{name}", "queue": queue, "labels": labels}
        )
        event = submitted.model_copy(
            update={
                "job_id": f"{tag}{i}", "event_id": uuid.uuid4().hex, "spec": spec,
                "dialect": dialect, "occurred_at": base + timedelta(minutes=i),
            }
        )  # fmt: skip
        await views.record(event, 1000 + i, None)
        await views.apply(project(event), 1000 + i)
        jobs[name] = event.job_id

    async def ids(**kw) -> set[str]:  # type: ignore[no-untyped-def]
        where = list_filters(
            kw.get("queue"), kw.get("dialect"), kw.get("name"), kw.get("after"), kw.get("before")
        )
        items, total = await views.list_jobs(user=None, state=None, limit=50, offset=0, where=where)
        assert total == len(items)
        return {i["id"] for i in items}

    assert await ids(name=f"{tag}-train") == {jobs["train-a"], jobs["train-b"]}
    assert await ids(name=f"{tag}-", queue="gpu", dialect="openpai") == {jobs["train-a"]}
    assert await ids(name=tag, after=base + timedelta(seconds=30)) == {
        jobs["train-b"],
        jobs["eval-a"],
    }
    # A naive time is read as UTC; the end of the range is excluded.
    naive = (base + timedelta(minutes=2)).replace(tzinfo=None)
    assert await ids(name=tag, before=naive) == {jobs["train-a"], jobs["train-b"]}
    assert await ids(name=f"{tag}-nothing") == set()
    vision = {**list_filters(None, None, tag, None, None), "labels.team": "vision"}
    items, _ = await views.list_jobs(user=None, state=None, limit=50, offset=0, where=vision)
    assert {i["id"] for i in items} == {jobs["train-a"], jobs["train-b"]}
    assert items[0]["labels"] == {"team": "vision"}


@pytest.mark.parametrize(
    ("sorted_most", "walk"), [(1000, True), (2, True), (2, False)], ids=["few", "many", "by_day"]
)
async def test_a_name_prefix_pages_alike_whichever_way_it_is_read(
    views: JobViews, monkeypatch: pytest.MonkeyPatch, sorted_most: int, walk: bool
) -> None:
    """A name prefix of few jobs is read through the name's index on the embedded store,
    one of many by a walk that may give up (here: at once, or left out) for a search
    of the matches day by day; on either store, every way gives the same pages, by
    cursor or offset, either order, over days."""
    from datetime import UTC, datetime

    import trainyard_status.adapters.views as views_module
    from trainyard_status.app import list_filters

    monkeypatch.setattr(views_module, "NAME_SORTED_MOST", sorted_most)
    monkeypatch.setattr(views_module, "NAME_WALK_MS", 0)
    if not walk:
        plans = JobViews._plans

        async def untimed(self: JobViews, *args: Any) -> list[views_module.Plan]:
            return [plan for plan in await plans(self, *args) if plan.max_ms is None]

        monkeypatch.setattr(JobViews, "_plans", untimed)
    base = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    tag = uuid.uuid4().hex[:6]
    submitted = next(e for e in example_events() if type(e).__name__ == "JobSubmitted")
    rng = random.Random(5)
    jobs = []  # (submitted_at, id, name, user, queue), oldest first
    for i in range(30):
        name = f"{tag}-{rng.choice(['a', 'b'])}{i}"
        user = rng.choice(["alice", "bob"])
        queue = f"{tag}-q{i % 2}"
        at = base + timedelta(hours=5 * (i // 3))  # over 3 days; ties: broken by the id
        event = submitted.model_copy(
            update={
                "job_id": f"{tag}{rng.randrange(10**6):06d}{i:02d}", "event_id": uuid.uuid4().hex,
                "spec": submitted.spec.model_copy(
                    update={"name": name, "user": user, "queue": queue}
                ),
                "occurred_at": at,
            }
        )  # fmt: skip
        await views.record(event, 2000 + i, None)
        await views.apply(project(event), 2000 + i)
        jobs.append((at, event.job_id, name, user, queue))

    async def pages(
        prefix: str, user: str | None, oldest: bool, before: Any, queue: str | None
    ) -> list[str]:
        where = list_filters(queue, None, prefix, None, before)
        got, after, offset = [], None, 0
        while True:
            items, _ = await views.list_jobs(
                user=user, state=None, limit=4, offset=offset, where=where,
                after=after, oldest_first=oldest, count=False,
            )  # fmt: skip
            got += [i["id"] for i in items]
            if len(items) < 4:
                return got
            # Cursor and offset pages alternate: both ways on from the same page.
            after = None if after else (items[-1]["submitted_at"], items[-1]["id"])
            offset = 0 if after else len(got)

    cut = base + timedelta(hours=35)
    for prefix, user, oldest, before, queue in [
        (f"{tag}-a", None, False, None, None),
        (f"{tag}-a", None, True, None, None),
        (f"{tag}-", "alice", False, None, None),
        (f"{tag}-b", None, False, cut, None),
        (f"{tag}-b1", None, True, None, None),
        # Another filter beside the name (a queue), tested in the name's matches.
        (f"{tag}-", None, False, None, f"{tag}-q1"),
        (f"{tag}-a", "bob", True, cut, f"{tag}-q0"),
    ]:
        want = [
            job_id
            for at, job_id, name, owner, where in sorted(jobs, reverse=not oldest)
            if name.startswith(prefix)
            and user in (None, owner)
            and (not before or at < before)
            and queue in (None, where)
        ]
        assert await pages(prefix, user, oldest, before, queue) == want, (prefix, user, queue)


async def test_the_live_feed_sends_each_change_once_from_its_listeners_arrival(
    views: JobViews,
) -> None:
    from trainyard_status.adapters.feed import JobFeed

    feed = JobFeed(views, overlap=8)
    start = await views.last_change()
    job = uuid.uuid4().hex
    events = lifecycle(job)
    async with feed.listen() as queue:
        assert await feed.walk() == 0  # the first walk only marks where "now" is
        await apply_all(views, events[:2], [start + 1, start + 2])
        for event, seq in zip(events[:2], [start + 1, start + 2], strict=True):
            await views.apply(project(event), seq)
        assert await feed.walk() == 1  # one job, at its latest change
        change = queue.get_nowait()
        assert change["id"] == job and change["state"] == "ACCEPTED"
        assert change["feed_seq"] == start + 2
        assert await feed.walk() == 0 and queue.empty()  # nothing sent twice
        # A replica's late write of an earlier sequence is still found (the overlap).
        finished = events[-1]
        await views.apply(project(finished), start + 5)
        await views.apply(project(events[2]), start + 3)  # QUEUED arrives late
        assert await feed.walk() == 1
        assert queue.get_nowait()["state"] == "SUCCEEDED"


async def test_the_live_feed_follows_a_jobs_tasks_and_tags(views: JobViews) -> None:
    # Found by an audit: the feed followed the job's own view only. A second task's
    # start, a task's end before the job's, a placement or a tag changed nothing there,
    # so a job's page kept showing a failed worker RUNNING until the job changed.
    from trainyard_common.events import JobTagged
    from trainyard_status.adapters.feed import JobFeed

    feed = JobFeed(views, overlap=8)
    start = await views.last_change()
    job = uuid.uuid4().hex
    events = lifecycle(job)
    seqs = [start + i for i in range(1, len(events) + 1)]
    async with feed.listen() as queue:
        assert await feed.walk() == 0
        await apply_all(views, events[:6], seqs[:6])  # RUNNING with worker 0
        assert await feed.walk() == 1
        assert queue.get_nowait()["state"] == "RUNNING"
        # Worker 0 ends, worker 1 starts and runs: the job's own view stays RUNNING.
        for event, seq in zip(events[6:9], seqs[6:9], strict=True):
            await apply_all(views, [event], [seq])
            assert await feed.walk() == 1, event
            change = queue.get_nowait()
            assert change["state"] == "RUNNING" and change["feed_seq"] == seq
        await apply_all(views, [events[6]], [seqs[6]])  # a redelivery moves nothing back
        assert await feed.walk() == 0 and queue.empty()
        assert (await views.get_job(job) or {})["feed_seq"] == seqs[8]
        tagged = JobTagged(job_id=job, tag="nightly", present=True)
        await apply_all(views, [tagged], [seqs[-1] + 1])
        assert await feed.walk() == 1
        assert queue.get_nowait()["feed_seq"] == seqs[-1] + 1


async def test_cursor_pages_stay_right_while_jobs_are_written_both_ways(views: JobViews) -> None:
    from datetime import UTC, datetime

    from trainyard_status.app import list_filters, make_cursor, read_cursor

    base = datetime(2026, 11, 25, 13, 0, tzinfo=UTC)
    tag = uuid.uuid4().hex[:6]
    submitted = next(e for e in example_events() if type(e).__name__ == "JobSubmitted")

    async def add(i: int, second: int) -> str:
        spec = submitted.spec.model_copy(update={"name": f"{tag}-{i}"})
        event = submitted.model_copy(
            update={
                "job_id": f"{tag}{i:02d}", "event_id": uuid.uuid4().hex, "spec": spec,
                "occurred_at": base + timedelta(seconds=second),
            }
        )  # fmt: skip
        await views.apply(project(event))
        return event.job_id

    # Seven jobs, three of them in the same second (ties broken by id).
    ids = [await add(i, s) for i, s in enumerate([0, 1, 1, 1, 2, 3, 4])]
    where = list_filters(None, None, f"{tag}-", None, None)
    for oldest_first in (False, True):
        seen: list[str] = []
        after = None
        while True:
            items, total = await views.list_jobs(
                user=None, state=None, limit=3, offset=0, where=where, after=after,
                oldest_first=oldest_first,
            )  # fmt: skip
            seen += [i["id"] for i in items]
            if len(items) < 3:
                break
            # A job written meanwhile, newer than everything: never shifts a page.
            if len(seen) == 3:
                ids.append(await add(len(ids), 60 + len(ids)))
            after = read_cursor(make_cursor(items[-1]["submitted_at"], items[-1]["id"]))
        # (ids grow with time, ties included)
        if oldest_first:
            expected = ids[:7] + ids[7:]  # walking forward, the new ones come at the end
        else:
            expected = sorted(ids[:7], reverse=True)
        assert seen == expected, (oldest_first, seen)
    counts = await views.count_states(where)
    assert counts == {"SUBMITTED": len(ids)}
    # A list page's counts (?counts=true): bounded, and said so when a bound was met.
    assert await views.count_states_within(where) == ({"SUBMITTED": len(ids)}, True)
    assert await views.count_states_within(where, most=len(ids)) == (counts, True)
    assert await views.count_states_within(where, most=3) == ({"SUBMITTED": 4}, False)
    assert await views.count_states_within(where, budget_ms=0) == ({}, False)
    # Within submitted_before/after (the console's "Submitted before" and its Older): the
    # page after a cursor goes on from it (the bound replaced the cursor's: the first
    # page again), and stays within the bounds both ways.
    start, end = base + timedelta(seconds=1), base + timedelta(seconds=4)
    where = list_filters(None, None, f"{tag}-", start, end)
    for oldest_first in (False, True):
        seen = []
        after = None
        for _ in range(5):  # (the same page again and again, else)
            items, _ = await views.list_jobs(
                user=None, state=None, limit=2, offset=0, where=where, after=after,
                oldest_first=oldest_first,
            )  # fmt: skip
            seen += [i["id"] for i in items]
            if len(items) < 2:
                break
            after = read_cursor(make_cursor(items[-1]["submitted_at"], items[-1]["id"]))
        expected = ids[1:6] if oldest_first else sorted(ids[1:6], reverse=True)
        assert seen == expected, (oldest_first, seen)


class FailsFirstCommit:
    """The store's batches, the first one lost at its commit (a full disk, a replica's
    insert met)."""

    def __init__(self, atomic: Atomic) -> None:
        self.atomic = atomic
        self.failed = False

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.atomic.transaction():
            yield
            if not self.failed:
                self.failed = True
                raise ConnectionError("the first commit is lost")

    def savepoint(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.atomic.savepoint()


async def test_an_event_is_counted_once_when_its_first_batch_is_not_stored(
    bus: Bus, doc_client: Client, db_prefix: str
) -> None:
    # Counted in the handler, before the commit, each event of a lost batch was
    # counted on both tries.
    from prometheus_client import REGISTRY

    def submitted() -> float:
        return sum(
            sample.value
            for family in REGISTRY.collect()
            if family.name == "trainyard_jobs_submitted"
            for sample in family.samples
            if sample.name == "trainyard_jobs_submitted_total"
        )

    job = uuid.uuid4().hex
    events = lifecycle(job)
    seqs = await bus.publish_all(events)
    database = batching(doc_client[f"{db_prefix}_counted"])
    views = JobViews(database)
    await views.ensure_indexes()
    atomic = FailsFirstCommit(batch_writes(database))
    before = submitted()
    stop = asyncio.Event()
    durable = f"counted-{job[:8]}"
    task = asyncio.create_task(
        bus.consume(
            durable,
            [ALL_EVENTS],
            partial(project_event, views=views),
            stop=stop,
            atomic=atomic,
        )
    )
    try:
        assert await bus.consumed(durable, seqs[-1], timeout_s=15)
    finally:
        stop.set()
        await task
    assert atomic.failed
    assert (await views.get_job(job))["state"] == "SUCCEEDED"
    assert submitted() - before == 1


async def test_openpais_list_answers_up_to_its_limit_a_store_page_at_a_time(
    views: JobViews, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenPAI answers up to `limit` (50000) in one list; the store is read a page at a
    time (pages of two here), so every job comes back and a short list means the end."""
    monkeypatch.setattr(openpai_api, "MAX_PAGE_SIZE", 2)
    vc = "vc" + uuid.uuid4().hex[:6]
    for i in range(5):
        await submitted_job(views, i + 1, at_s=i, dialect="openpai", name=f"j{i}", queue=vc)

    async def admin() -> Identity:
        return Identity("admin", admin=True)

    app = FastAPI()
    app.include_router(openpai_api.router(StatusContext(views, None, admin)))  # type: ignore[arg-type]
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://s") as http:

        async def names(**params: object) -> list[str]:
            answer = await http.get("/api/v2/jobs", params={"vc": vc, **params})
            assert answer.status_code == 200, answer.text
            return [item["name"] for item in answer.json()]

        assert await names(limit=5) == ["j4", "j3", "j2", "j1", "j0"]
        assert await names(limit=3, offset=1) == ["j3", "j2", "j1"]
        assert await names(limit=50) == ["j4", "j3", "j2", "j1", "j0"]
        assert await names(limit=4, order="submissionTime,ASC") == ["j0", "j1", "j2", "j3"]
        counted = await http.get("/api/v2/jobs", params={"vc": vc, "withTotalCount": "true"})
        assert counted.json()["totalCount"] == 5 and len(counted.json()["data"]) == 5
        # A job submitted while the pages are read shifts none of them (no job twice).
        read = views.list_jobs

        async def then_submit(**kwargs: Any) -> Any:
            found = await read(**kwargs)
            await submitted_job(views, 99, at_s=60, dialect="openpai", name="late", queue=vc)
            return found

        monkeypatch.setattr(views, "list_jobs", then_submit)
        assert await names(limit=5) == ["j4", "j3", "j2", "j1", "j0"]


async def test_a_kubernetes_list_comes_a_page_at_a_time_with_limit_and_continue(
    views: JobViews,
) -> None:
    """kubectl and client-go list 500 objects at a time (``limit``), following each
    page's ``continue``; every object was read and rendered in one answer (an admin's
    list: every job of the dialect). Pages come in creation order, skip what is not
    the list's (another namespace, another kind, a label not selected), each with the
    first page's version; an object created after the first page is left out of the
    rest, as from the API server's snapshot."""
    ns = "ns-" + uuid.uuid4().hex[:6]
    seq = iter(range(1, 1000))

    async def pytorchjob(name: str, *, at_s: float, namespace: str = ns, plural: str = "pytorchjobs",
                         team: str = "a") -> None:  # fmt: skip
        kind = {"pytorchjobs": "PyTorchJob", "tfjobs": "TFJob"}[plural]
        event = lifecycle(uuid.uuid4().hex)[0]
        original = {
            "apiVersion": "kubeflow.org/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": {"team": team}},
            "spec": {},
        }  # fmt: skip
        submitted = event.model_copy(
            update={
                "spec": event.spec.model_copy(update={"name": name}),
                "occurred_at": event.occurred_at + timedelta(seconds=at_s),
                "dialect": "kubeflow", "dialect_key": f"{namespace}/{plural}/{name}",
                "original": original, "name_claimed": True,
            }
        )  # fmt: skip
        await apply_all(views, [submitted], [next(seq)])

    for i in range(7):
        await pytorchjob(f"j{i}", at_s=i, team="ab"[i % 2])
    await pytorchjob("elsewhere", at_s=2.5, namespace=ns + "-x")
    await pytorchjob("a-tfjob", at_s=3.5, plural="tfjobs")

    async def admin() -> Identity:
        return Identity("admin", admin=True)

    app = FastAPI()
    app.include_router(k8s_resources.router(StatusContext(views, None, admin)))  # type: ignore[arg-type]
    path = f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://s") as http:

        async def pages(**params: str) -> list[tuple[list[str], dict[str, Any]]]:
            found = []
            while True:
                answer = await http.get(path, params=params)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                found.append(([i["metadata"]["name"] for i in body["items"]], body["metadata"]))
                if not body["metadata"].get("continue"):
                    return found
                params = {**params, "continue": body["metadata"]["continue"]}
                if len(found) == 1:
                    await pytorchjob("late", at_s=60)  # created after the first page

        every = await pages(limit="3")
        assert [names for names, _ in every] == [["j0", "j1", "j2"], ["j3", "j4", "j5"], ["j6"]]
        assert len({meta["resourceVersion"] for _, meta in every}) == 1, every
        # Without a limit, every object at once: the late one too.
        whole = await pages()
        assert whole[0][0] == ["j0", "j1", "j2", "j3", "j4", "j5", "j6", "late"]
        # A page full to its limit: the next may hold none, and says it is the last.
        selected = await pages(limit="2", labelSelector="team=b")
        assert [names for names, _ in selected] == [["j1", "j3"], ["j5"]]
        exact = await pages(limit="4", labelSelector="team=b")
        assert [names for names, _ in exact] == [["j1", "j3", "j5"]]
        assert "continue" not in exact[0][1]
        # A continue without a limit: the rest of the list, as the API server gives it.
        [(now, _)] = await pages()
        first = await http.get(path, params={"limit": "5"})
        rest = await http.get(path, params={"continue": first.json()["metadata"]["continue"]})
        assert [i["metadata"]["name"] for i in rest.json()["items"]] == now[5:]
        assert "continue" not in rest.json()["metadata"] and len(now) > 6
        # Refused: a token this server did not give, a limit that is no number, a version
        # beside a continue (a continued list is at its first page's).
        token = first.json()["metadata"]["continue"]
        for params in (
            {"continue": "!!!"}, {"continue": "e30"}, {"limit": "x"},
            {"continue": token, "resourceVersion": "7"},
        ):  # fmt: skip
            answer = await http.get(path, params={"limit": "2", **params})
            assert answer.status_code == 400, (params, answer.text)
            assert answer.json()["reason"] == "BadRequest", answer.json()
        # 0 for the version is any: taken.
        answer = await http.get(path, params={"continue": token, "resourceVersion": "0"})
        assert answer.status_code == 200, answer.text


async def test_a_late_tag_change_does_not_undo_a_later_one(views: JobViews) -> None:
    # Found by an audit: tag adds and removals were applied whatever their order, so
    # an add applied after its removal (two replicas, or a redelivery after a failed
    # savepoint) brought the removed tag back for good.
    from trainyard_common.events import JobTagged

    submitted = next(e for e in example_events() if type(e).__name__ == "JobSubmitted")
    job = submitted.model_copy(update={"job_id": uuid.uuid4().hex, "event_id": uuid.uuid4().hex})
    await views.apply(project(job), 10)

    async def tag(name: str, present: bool, seq: int) -> None:
        event = JobTagged(job_id=job.job_id, tag=name, present=present)
        await views.apply(project(event), seq)

    await tag("nightly", False, 101)  # the removal first...
    await tag("nightly", True, 100)  # ...then the add it followed
    await tag("a.b$c", True, 103)  # another tag (dots and a dollar) meanwhile
    await tag("a.b$c", False, 102)  # an older removal of it: too late
    assert (await snapshot(views, job.job_id))["tags"] == ["a.b$c"]
    await tag("nightly", True, 104)  # a newer add counts
    await tag("nightly", True, 104)  # and a repeat of it is one
    assert sorted((await snapshot(views, job.job_id))["tags"]) == ["a.b$c", "nightly"]


async def test_a_label_key_with_dashes_slashes_and_colons_is_a_filter_like_any(
    views: JobViews,
) -> None:
    """DLC's Tags filter takes keys of letters, digits and "_-/:" ("app-name"): on the
    embedded store such a key beside another filter was refused as no plain field
    path, and DLC's list always filters by its dialect too."""
    tag = uuid.uuid4().hex[:8]
    labels = [EnvVar(name="app-name", value=tag), EnvVar(name="a/b:c", value=tag)]
    mine = await submitted_job(views, 3100, at_s=1, labels=labels, dialect="dlc")
    await submitted_job(views, 3101, at_s=2, labels=labels[:1], dialect="dlc")
    for where, count in [
        ({"labels.app-name": tag}, 2),
        ({"labels.a/b:c": tag}, 1),
        ({"labels.app-name": tag, "labels.a/b:c": tag}, 1),
        ({"labels.a/b:c": tag, "labels.app-name": {"$ne": None}}, 1),
    ]:
        where = {"dialect": "dlc", **where}
        items, total = await views.list_jobs(user=None, state=None, limit=5, offset=0, where=where)
        assert total == count == len(items), where
        assert mine in [i["id"] for i in items], where
        assert await views.count_jobs(user=None, state=None, where=dict(where)) == count


@pytest.mark.parametrize("sorted_most", [1000, 2], ids=["few", "many"])
async def test_a_label_filter_reads_its_few_jobs_by_id_and_lists_alike_either_way(
    views: JobViews, monkeypatch: pytest.MonkeyPatch, sorted_most: int
) -> None:
    """No index of the jobs holds their labels: a rare label walked every job. Each
    label is also a document of its own, written with the job's submission (and for a
    store from before, once at start): few matches are read by id, many walked as
    before; the pages are the same either way, with a user, a cursor or a second label."""
    import trainyard_status.adapters.views as views_module

    monkeypatch.setattr(views_module, "NAME_SORTED_MOST", sorted_most)
    team = "t" + uuid.uuid4().hex[:8]
    jobs = []  # (id, user, labels), oldest first
    for i in range(8):
        labels = [EnvVar(name="team", value=team), EnvVar(name="run", value=f"r{i % 3}")]
        user = ["alice", "bob"][i % 2]
        job_id = await submitted_job(views, 3000 + i, at_s=i, labels=labels, user=user)
        jobs.append((job_id, user, {"team": team, "run": f"r{i % 3}"}))
    rows = [row async for row in views.labels.find({"job_id": jobs[0][0]})]
    assert sorted((row["pair"], row["user"]) for row in rows) == sorted(
        [('["run", "r0"]', "alice"), (f'["team", "{team}"]', "alice")]
    )

    async def ids(user: str | None, **labels: str) -> list[str]:
        where = {f"labels.{key}": value for key, value in labels.items()}
        first, total = await views.list_jobs(
            user=user, state=None, limit=2, offset=0, where=dict(where)
        )
        after = (first[-1]["submitted_at"], first[-1]["id"])
        rest, _ = await views.list_jobs(
            user=user, state=None, limit=50, offset=0, where=dict(where), after=after
        )
        counted = await views.count_jobs(user=user, state=None, where=dict(where))
        assert total == counted == len(first) + len(rest)
        return [item["id"] for item in first + rest]

    def want(user: str | None, **labels: str) -> list[str]:
        return [
            job_id
            for job_id, owner, have in reversed(jobs)
            if user in (None, owner) and all(have[k] == v for k, v in labels.items())
        ]

    for user, labels in [
        (None, {"team": team}),
        ("bob", {"team": team}),
        (None, {"team": team, "run": "r1"}),
        ("alice", {"run": "r0", "team": team}),
    ]:
        assert await ids(user, **labels) == want(user, **labels), (user, labels)

    # A store from before keeps no label documents: until they are filled (once, beside
    # the service), a label filter walks the jobs as before; the same pages either way.
    await views.labels.delete_one({"_id": rows[0]["_id"]})
    await views.meta.delete_one({"_id": "labels"})
    await views.ensure_indexes()
    assert not views.labels_ready
    assert await ids(None, team=team) == want(None, team=team)
    assert await views.fill_labels() >= 1
    assert views.labels_ready
    assert await views.labels.find_one({"_id": rows[0]["_id"]}) == rows[0]
    assert await views.fill_labels() == 0  # once
    assert await ids(None, team=team) == want(None, team=team)


async def test_the_labels_fill_resumes_stops_and_catches_up_with_an_older_replica(
    views: JobViews,
) -> None:
    """The fill of a store from before the labels' index runs beside the service: it
    goes on from where a stopped one left off, stops when the service does, and reads
    again the jobs submitted since it began (a replica of the version before, still
    projecting during a rolling upgrade, writes no label rows)."""
    from datetime import UTC, datetime

    from trainyard_status.adapters.views import label_rows

    jobs = [
        {"_id": f"f{i}", "user": "u", "state": "SUBMITTED", "labels": {"k": f"v{i}"},
         "submitted_at": datetime(2026, 11, 1, tzinfo=UTC)}
        for i in range(5)
    ]  # fmt: skip
    for job in jobs:
        await views.jobs.insert_one(job)

    async def rows() -> set[str]:
        return {row["job_id"] async for row in views.labels.find({})}

    await views.meta.delete_one({"_id": "labels"})  # as a store from before has none
    await views.ensure_indexes()
    assert not views.labels_ready and await rows() == set()
    stopped = asyncio.Event()
    stopped.set()
    await views.fill_labels(stopped, page=2)  # stopped before its first page
    assert not views.labels_ready and await rows() == set()
    await views.meta.update_one({"_id": "labels_fill"}, {"$set": {"after": "f1"}}, upsert=True)
    stop = asyncio.Event()
    fill = asyncio.create_task(views.fill_labels(stop, page=2, catch_up_s=0.2))
    for _ in range(100):
        if views.labels_ready:
            break
        await asyncio.sleep(0.02)
    assert views.labels_ready
    assert await rows() == {"f2", "f3", "f4"}  # on from where the last fill was
    late = {**jobs[0], "_id": "late", "submitted_at": datetime.now(UTC)}
    await views.jobs.insert_one(late)  # projected by the version before: no rows
    for _ in range(100):
        if "late" in await rows():
            break
        await asyncio.sleep(0.05)
    found = await views.labels.find_one({"job_id": "late"})
    want = label_rows("late", late)[0]
    assert found is not None and (found["_id"], found["pair"]) == (want["_id"], want["pair"])
    stop.set()
    await asyncio.wait_for(fill, 5)


async def test_the_tasks_index_by_job_alone_of_an_older_store_is_dropped(views: JobViews) -> None:
    """A store made before the tasks' compound index kept the older one by job alone,
    updated at every write of a task for nothing: starting drops it, once."""
    from trainyard_common.docstore import SqliteCollection

    async def indexes() -> set[str]:
        if isinstance(views.tasks, SqliteCollection):
            rows = views.tasks.database.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'"
            )
            return {row[0] for row in rows}
        return set(await views.tasks.index_information())

    await views.tasks.create_index([("job_id", 1)])
    old = (await indexes()) & {"ix_tasks_job_id_1", "job_id_1"}
    assert len(old) == 1, old
    await views.ensure_indexes()
    left = await indexes()
    assert not left & old and len(left) > 1, left  # the compound one stays
    await views.ensure_indexes()  # nothing to drop now: no error
    assert await indexes() == left


async def test_a_lists_total_is_counted_up_to_a_bound_and_says_when_it_stopped(
    views: JobViews, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting every match of a filter read each of them (every job, for a filter no
    index serves), the status process held meanwhile: the total of /v1/jobs is counted
    up to a bound and for a bounded time, and says when it stopped there."""
    from trainyard_common.auth import TokenStore
    from trainyard_status import app as status_app

    queue = "q" + uuid.uuid4().hex[:8]
    ids = [await submitted_job(views, 2000 + i, at_s=i, queue=queue) for i in range(5)]
    # The views count up to one past the bound (more than it), the whole filter being
    # walked no further, with or without a state.
    assert await views.count_jobs(user=None, state=None, where={"queue": queue}, most=3) == 4
    assert await views.count_jobs(user=None, state=None, where={"queue": queue}, most=10) == 5
    assert await views.count_jobs(user=None, state="SUBMITTED", where={"queue": queue}) == 5
    assert await views.count_jobs(user=None, state="RUNNING", where={"queue": queue}) == 0
    # Every job of this store (others' tests may share a MongoDB one): counted the same.
    every = await views.count_jobs(user=None, state=None, most=10_000)
    assert every is not None and 5 <= every <= 10_001

    app = status_app.create_app(views, TokenStore(None, "admin"))
    auth = {"Authorization": "Bearer admin"}
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://s") as http:

        async def page(**params: Any) -> dict[str, Any]:
            answer = await http.get("/v1/jobs", params={"queue": queue, **params}, headers=auth)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        first = await page(limit=2)
        assert (first["total"], first["total_exact"]) == (5, True)
        assert [i["id"] for i in first["items"]] == [ids[4], ids[3]]
        assert "counts" not in first or first["counts"] is None
        counted = await page(limit=2, counts="true")
        assert (counted["counts"], counted["counts_exact"]) == ({"SUBMITTED": 5}, True)
        monkeypatch.setattr(status_app, "COUNT_MOST", 3)
        capped = await page(limit=2)
        assert (capped["total"], capped["total_exact"]) == (3, False)
        assert (await page(limit=2, offset=3))["total"] == 5  # never below what was shown

        # Out of time (a filter no index serves, on a large store): what the page
        # shows, and not exact.
        async def out_of_time(**_: Any) -> None:
            return None

        monkeypatch.setattr(views, "count_jobs", out_of_time)
        late = await page(limit=2, offset=1)
        assert (late["total"], late["total_exact"]) == (3, False)


async def test_a_jobs_history_and_tasks_come_a_bounded_page_at_a_time(
    views: JobViews, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job may have up to 100,000 tasks and three events or more each, and the
    console reads its page and its history on every change: both come a page at a time
    (by default, one small job's whole answer as before)."""
    from trainyard_common.auth import TokenStore
    from trainyard_common.events import FailureClass, JobRetrying
    from trainyard_status import app as status_app

    job = uuid.uuid4().hex
    events = lifecycle(job)[:-1]  # attempt 1 not finished: retried
    # A second attempt of three tasks (a role that sorts before the first's too).
    events += [
        JobRetrying(
            job_id=job, attempt=2, previous_attempt=1, reason="again",
            failure_class=FailureClass.USER, not_before=events[0].occurred_at,
        ),
        *[
            TaskStateChanged(
                job_id=job, attempt=2, role=role, index=index, state=TaskState.RUNNING, seq=1
            )
            for role, index in (("worker", 0), ("worker", 1), ("chief", 0))
        ],
    ]  # fmt: skip
    await apply_all(views, events, range(3000, 3000 + len(events)))
    order = [
        (1, "worker", 0),
        (1, "worker", 1),
        (2, "chief", 0),
        (2, "worker", 0),
        (2, "worker", 1),
    ]

    app = status_app.create_app(views, TokenStore(None, "admin"))
    auth = {"Authorization": "Bearer admin"}
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://s") as http:

        async def get(path: str, **params: Any) -> dict[str, Any]:
            answer = await http.get(f"/v1/jobs/{job}{path}", params=params, headers=auth)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        # A small job: its whole history and every task, as before.
        whole = await get("/events")
        assert len(whole["items"]) == len(events) and whole["next_after_seq"] is None
        view = await get("")
        assert [(t["attempt"], t["role"], t["index"]) for t in view["tasks"]] == order
        assert view["tasks_next"] is None

        # The history a page at a time, from where the page before ended.
        seqs, after = [], 0
        while True:
            page = await get("/events", limit=4, after_seq=after)
            assert len(page["items"]) <= 4
            seqs += [e["seq"] for e in page["items"]]
            if page["next_after_seq"] is None:
                break
            after = page["next_after_seq"]
            assert after == seqs[-1]
        assert seqs == [e["seq"] for e in whole["items"]]
        assert (await get("/events", after_seq=seqs[-1]))["items"] == []
        # A sequence past what a store's integers hold is a 422, not the store's 500.
        huge = await http.get(f"/v1/jobs/{job}/events", params={"after_seq": 10**20},
                              headers=auth)  # fmt: skip
        assert huge.status_code == 422, huge.text
        forged = base64.urlsafe_b64encode(json.dumps([10**20, "w", 0]).encode()).decode()
        huge = await http.get(f"/v1/jobs/{job}/tasks", params={"cursor": forged}, headers=auth)
        assert huge.status_code == 400, huge.text

        # The tasks: the job's page shows the first ones, the rest come from /tasks.
        monkeypatch.setattr(status_app, "TASKS_SHOWN", 2)
        # More than fit: the current attempt's first (found in review: the first by
        # attempt were the earliest attempts', and the current one's were not shown).
        view = await get("")
        assert view["attempt"] == 2
        assert [(t["attempt"], t["role"], t["index"]) for t in view["tasks"]] == order[2:4]
        listed, cursor = [], view["tasks_next"]
        while cursor is not None:
            page = await get("/tasks", limit=1, cursor=cursor)
            listed += [(t["attempt"], t["role"], t["index"]) for t in page["items"]]
            cursor = page["next"]
        assert listed == order[4:]
        monkeypatch.setattr(status_app, "TASKS_SHOWN", 5)  # all fit: all, as before
        assert [(t["attempt"], t["role"], t["index"]) for t in (await get(""))["tasks"]] == order
        monkeypatch.setattr(status_app, "TASKS_SHOWN", 2)
        whole_tasks = await get("/tasks")
        assert [(t["attempt"], t["role"], t["index"]) for t in whole_tasks["items"]] == order
        second = await get("/tasks", attempt=2, limit=2)
        assert [(t["role"], t["index"]) for t in second["items"]] == [("chief", 0), ("worker", 0)]
        rest = await get("/tasks", attempt=2, cursor=second["next"])
        assert [(t["role"], t["index"]) for t in rest["items"]] == [("worker", 1)]
        assert rest["next"] is None
        bad = await http.get(f"/v1/jobs/{job}/tasks", params={"cursor": "nonsense"}, headers=auth)
        assert bad.status_code == 400
        other = await http.get(f"/v1/jobs/{uuid.uuid4().hex}/tasks", headers=auth)
        assert other.status_code == 404


async def test_the_queue_wait_counts_each_jobs_first_placement_once_whatever_its_attempt(
    views: JobViews,
) -> None:
    """trainyard_queue_wait_seconds is "submission to first placement": only attempt 1's
    placement was observed, so a job paused while it waited (or submitted paused, T9k's
    runMode pause), first placed as attempt 2, was never. Through the status handler on
    the real store: each job once, a redelivery or a later attempt not again, nor an
    earlier attempt's placement projected late."""
    from prometheus_client import REGISTRY

    from trainyard_common.bus import Delivery
    from trainyard_common.events import FailureClass, JobRetrying, ResumeJob

    queue = "wait-" + uuid.uuid4().hex[:8]

    def waits() -> tuple[float, float]:
        labels = {"queue": queue}
        count = REGISTRY.get_sample_value("trainyard_queue_wait_seconds_count", labels)
        total = REGISTRY.get_sample_value("trainyard_queue_wait_seconds_sum", labels)
        return count or 0.0, total or 0.0

    seq = iter(range(5000, 6000))

    async def deliver(*events: Any) -> None:
        for event in events:
            delivery = Delivery(stream_seq=next(seq), num_delivered=1, subject="yard.job.x")
            await project_event(event, delivery, views)

    def job_events(job: str) -> dict[str, Any]:
        by_type = {type(e).__name__: e for e in example_events()}
        submitted = by_type["JobSubmitted"]
        spec = submitted.spec.model_copy(update={"queue": queue})

        def copy(name: str, **update: Any) -> Any:
            fields = {"job_id": job, "event_id": uuid.uuid4().hex, **update}
            if "spec" in type(by_type[name]).model_fields:
                fields["spec"] = spec
            return by_type[name].model_copy(update=fields)

        t0 = submitted.occurred_at
        return {
            "submitted": copy("JobSubmitted", occurred_at=t0),
            "accepted": copy("JobAccepted", occurred_at=t0 + timedelta(seconds=1)),
            "queued": copy("JobQueued", occurred_at=t0 + timedelta(seconds=2)),
            "placed1": copy("JobPlaced", occurred_at=t0 + timedelta(seconds=5)),
            "placed2": copy("JobPlaced", attempt=2, occurred_at=t0 + timedelta(seconds=60)),
            "placed3": copy("JobPlaced", attempt=3, occurred_at=t0 + timedelta(seconds=90)),
        }

    # Paused while it waited: attempt 1 never placed; resumed, placed as attempt 2.
    paused = job_events(uuid.uuid4().hex)
    job = paused["submitted"].job_id
    await deliver(
        paused["submitted"], paused["accepted"], paused["queued"],
        JobInterrupted(job_id=job, attempt=1, cause=InterruptCause.PAUSED, reason="paused"),
        ResumeJob(job_id=job, requested_by="alice"),
        paused["placed2"],
    )  # fmt: skip
    assert waits() == (1.0, 60.0)
    # Its placement delivered again, then its attempt's failure retried and placed anew.
    await deliver(
        paused["placed2"],
        JobRetrying(
            job_id=job, attempt=3, previous_attempt=2, reason="x",
            failure_class=FailureClass.USER, not_before=paused["placed2"].occurred_at,
        ),
        paused["placed3"],
    )  # fmt: skip
    assert waits() == (1.0, 60.0)

    # Placed at once (attempt 1), as before; then preempted and placed again.
    plain = job_events(uuid.uuid4().hex)
    await deliver(plain["submitted"], plain["accepted"], plain["queued"], plain["placed1"])
    assert waits() == (2.0, 65.0)
    await deliver(plain["placed2"])
    assert waits() == (2.0, 65.0)

    # Out of order: attempt 2's placement projected before attempt 1's.
    late = job_events(uuid.uuid4().hex)
    await deliver(late["submitted"], late["accepted"], late["placed2"], late["placed1"])
    assert waits() == (3.0, 125.0)
