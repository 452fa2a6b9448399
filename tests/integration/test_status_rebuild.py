"""`yard admin rebuild --apply` on a live system, against a real NATS server and both
stores: it must never delete or roll back a live view (found by a crash audit).

- The replay ended at its first empty fetch (1 s): a slow server's answer was taken for
  the end of the stream, and the part read deleted every live view it had not reached.
- A replay that cannot finish is refused: nothing compared, nothing written.
- The jobs that changed after the rebuild began were told from the jobs as first read:
  a task read later, changed meanwhile, was written back with the rebuild's older copy.
- A repair overwrote whatever the live document had become since it was read."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from trainyard_common import bus as bus_module
from trainyard_common.bus import Bus, Delivery
from trainyard_common.contracts import example_events
from trainyard_common.errors import ReplayIncomplete
from trainyard_common.events import (
    Event,
    JobFinished,
    JobState,
    JobTagged,
    TaskState,
    TaskStateChanged,
)
from trainyard_common.storage import Client
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS, STREAM
from trainyard_common.telemetry import trace_id_of
from trainyard_status.adapters.views import JobViews, compare_views
from trainyard_status.handlers import project_only, rebuild


@pytest.fixture
async def live(doc_client: Client, db_prefix: str) -> JobViews:
    views = JobViews(doc_client[f"{db_prefix}_status"])
    await views.ensure_indexes()
    return views


def started(job_id: str) -> list[Event]:
    """A job's events up to its two tasks running."""
    by_type = {type(e).__name__: e for e in example_events()}
    events: list[Event] = [
        by_type[n].model_copy(update={"job_id": job_id, "event_id": uuid.uuid4().hex})
        for n in ("JobSubmitted", "JobAccepted", "JobQueued", "JobPlaced")
    ]
    for index in range(2):
        for seq, state in enumerate((TaskState.STARTING, TaskState.RUNNING), 1):
            events.append(running(job_id, index, seq, state))
    return events


def running(job_id: str, index: int, seq: int, state: TaskState) -> TaskStateChanged:
    return TaskStateChanged(
        job_id=job_id, role="worker", index=index, state=state, seq=seq, node="node-0",
        exit_code=0 if state.terminal else None,
    )  # fmt: skip


def finished(job_id: str) -> list[Event]:
    return [
        *started(job_id),
        *(running(job_id, i, 3, TaskState.SUCCEEDED) for i in range(2)),
        JobFinished(job_id=job_id, state=JobState.SUCCEEDED, reason="all ended", exit_code=0),
    ]


async def happen(bus: Bus, views: JobViews, events: list[Event]) -> None:
    """On the stream, and projected into ``views`` as the status consumer would: with
    the trace the stored message carries (where an earlier test left tracing on, the
    replay records it, and a live view without it differed)."""
    for event in events:
        seq = await bus.publish(event)
        stored = await bus.js.get_msg(STREAM, seq)
        trace = trace_id_of(dict(stored.headers or {}))
        await project_only(event, Delivery(seq, 1, "yard.job.x", trace), views)


async def snapshot(views: JobViews) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [doc async for doc in getattr(views, name).find({}).sort([("_id", 1)])]
        for name in ("jobs", "tasks", "events")
    }


def fetches_time_out(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, times: int, late: bool = False
) -> None:
    """The replay's first ``times`` fetches come back empty, as from a server too slow
    to answer within the fetch's timeout; ``late``: the server had delivered what they
    asked for, which comes with the next fetch (nats-py keeps what arrives late)."""
    bind = bus.js.pull_subscribe_bind

    async def bound(*args: Any, **kwargs: Any) -> Any:
        sub = await bind(*args, **kwargs)
        fetch = sub.fetch
        left = [times]
        held: list[Any] = []

        async def slow(*a: Any, **k: Any) -> Any:
            if left[0] > 0:
                left[0] -= 1
                if late:
                    held.extend(await fetch(*a, **k))
                else:
                    await asyncio.sleep(0.05)
                raise NatsTimeoutError
            if held:
                given = list(held)
                held.clear()
                return given
            return await fetch(*a, **k)

        sub.fetch = slow  # type: ignore[method-assign]
        return sub

    monkeypatch.setattr(bus.js, "pull_subscribe_bind", bound)


@pytest.mark.parametrize(("times", "late"), [(2, False), (1, True)], ids=["slow", "late"])
async def test_a_slow_fetch_does_not_end_the_replay(
    bus: Bus,
    live: JobViews,
    doc_client: Client,
    db_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    times: int,
    late: bool,
) -> None:
    # "late" (found in review): the replay ended when nothing was left to deliver, while
    # what was delivered after a fetch's timeout still waited to be handled; the views
    # it had not reached were then deleted as "only live".
    jobs = [uuid.uuid4().hex for _ in range(3)]
    for job_id in jobs:
        await happen(bus, live, finished(job_id))
    before = await snapshot(live)
    fetches_time_out(bus, monkeypatch, times=times, late=late)
    report = await rebuild(bus, doc_client, f"{db_prefix}_status", live, apply=True)
    assert report["messages"] == 3 * 11 and report["different"] == 0, report
    assert await snapshot(live) == before


async def test_a_replay_that_cannot_finish_is_refused_and_writes_nothing(
    bus: Bus, live: JobViews, doc_client: Client, db_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await happen(bus, live, finished(uuid.uuid4().hex))
    before = await snapshot(live)
    monkeypatch.setattr(bus_module, "REPLAY_STALL_S", 0.5, raising=False)
    fetches_time_out(bus, monkeypatch, times=1000)
    with pytest.raises(ReplayIncomplete, match="up to sequence 0 of 11"):
        await rebuild(bus, doc_client, f"{db_prefix}_status", live, apply=True)
    assert await snapshot(live) == before


class Interposed:
    """A view's collection that runs ``before`` once, at the first read of a walk over
    it (``find``) or before its first ``method``: something else writing meanwhile."""

    def __init__(self, collection: Any, before: Callable[[], Awaitable[None]], method: str) -> None:
        self._collection = collection
        self._before: Callable[[], Awaitable[None]] | None = before
        self._method = method

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name != self._method:
            return attribute

        async def first(*args: Any, **kwargs: Any) -> Any:
            await self._run()
            return await attribute(*args, **kwargs)

        return first

    async def _run(self) -> None:
        if self._before is not None:
            before, self._before = self._before, None
            await before()

    def find(self, *args: Any, **kwargs: Any) -> Any:
        return _Walk(self._collection.find(*args, **kwargs), self)


class _Walk:
    def __init__(self, cursor: Any, owner: Interposed) -> None:
        self._cursor, self._owner = cursor, owner

    def sort(self, *args: Any, **kwargs: Any) -> _Walk:
        return _Walk(self._cursor.sort(*args, **kwargs), self._owner)

    async def __aiter__(self) -> Any:
        if self._owner._method == "find":
            await self._owner._run()
        async for doc in self._cursor:
            yield doc


async def test_a_task_that_changed_after_its_job_was_read_is_not_rolled_back(
    bus: Bus, live: JobViews, doc_client: Client, db_prefix: str
) -> None:
    job_id = uuid.uuid4().hex
    await happen(bus, live, started(job_id))
    tasks = live.tasks
    # After the walk read the job, before it reads the tasks: the first task ends.
    ended = running(job_id, 0, 3, TaskState.SUCCEEDED)
    live.tasks = Interposed(tasks, partial(happen, bus, live, [ended]), "find")  # type: ignore[assignment]
    report = await rebuild(bus, doc_client, f"{db_prefix}_status", live, apply=True)
    live.tasks = tasks
    assert report["different"] == 0, report
    task = await live.tasks.find_one({"job_id": job_id, "index": 0})
    assert task is not None and (task["state"], task["seq"]) == ("SUCCEEDED", 3)


async def test_a_repair_leaves_a_document_changed_since_it_was_read(
    bus: Bus, live: JobViews, doc_client: Client, db_prefix: str
) -> None:
    job_id = uuid.uuid4().hex
    events = finished(job_id)
    await happen(bus, live, events)
    until = await bus.last_seq()
    rebuilt = JobViews(doc_client[f"{db_prefix}_rebuilt"])
    await bus.replay_stream(
        "test-rebuild", [ALL_EVENTS, ALL_COMMANDS], partial(project_only, views=rebuilt), until
    )
    # Damaged behind the platform's back: a repair is due...
    await live.jobs.update_one({"_id": job_id}, {"$set": {"state": "RUNNING"}})
    # ...but as it is made, the job is tagged (after the comparison read it).
    jobs = live.jobs
    tagged = JobTagged(job_id=job_id, tag="kept")
    live.jobs = Interposed(jobs, partial(happen, bus, live, [tagged]), "replace_one")  # type: ignore[assignment]
    [difference] = await compare_views(live, rebuilt, until, apply=True)
    live.jobs = jobs
    assert difference == {
        "collection": "jobs",
        "id": job_id,
        "difference": "differs",
        "left": "changed while compared",
    }
    doc = await live.jobs.find_one({"_id": job_id})
    assert doc is not None and doc["tags"] == ["kept"]
