"""The status projections against the real MongoDB-wire store: redelivered and late
events change nothing twice, history keeps stream order."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest

from trainyard_common.contracts import example_events
from trainyard_common.events import JobFinished, JobState, TaskState, TaskStateChanged
from trainyard_common.storage import mongo_client
from trainyard_status.adapters.views import JobViews, job_view
from trainyard_status.domain.projection import project


@pytest.fixture
async def views(mongo_url: str, db_prefix: str):
    client = mongo_client(mongo_url)
    views = JobViews(client[f"{db_prefix}_status"])
    await views.ensure_indexes()
    yield views
    await client.drop_database(f"{db_prefix}_status")
    await client.close()


def lifecycle(job_id: str):
    """A job's events in stream order: submitted .. placed, two tasks run, job succeeds."""
    by_type = {type(e).__name__: e for e in example_events()}
    events = [by_type[n].model_copy(update={"job_id": job_id, "event_id": uuid.uuid4().hex})
              for n in ("JobSubmitted", "JobAccepted", "JobQueued", "JobPlaced")]
    for index in range(2):
        for seq, state in enumerate((TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED), 1):
            events.append(TaskStateChanged(job_id=job_id, role="worker", index=index, state=state,
                                           seq=seq, node="node-0",
                                           exit_code=0 if state.terminal else None))
    events.append(JobFinished(job_id=job_id, state=JobState.SUCCEEDED, reason="all tasks ended",
                              exit_code=0))
    return events


async def apply_all(views: JobViews, events, seqs) -> None:
    for event, seq in zip(events, seqs):
        await views.record(event, seq, None)
        await views.apply(project(event))


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
        ("worker", 0, "SUCCEEDED", "node-0"), ("worker", 1, "SUCCEEDED", "node-0")]
    assert view["tasks"][0]["ports"] == [{"label": "http", "ports": [20100]}]
    history = await views.history(job)
    assert [h["type"] for h in history] == [type(e).__name__ for e in events]


async def test_redelivered_and_shuffled_events_give_the_same_view(views: JobViews) -> None:
    job_a, job_b = uuid.uuid4().hex, uuid.uuid4().hex
    events_a = lifecycle(job_a)
    await apply_all(views, events_a, range(1, len(events_a) + 1))
    # Job b gets the same events with every one delivered twice, in a shuffled order.
    events_b = [e.model_copy(update={"job_id": job_b, "event_id": uuid.uuid4().hex}) for e in events_a]
    pairs = list(zip(events_b, range(1, len(events_b) + 1))) * 2
    random.Random(7).shuffle(pairs)
    await apply_all(views, [p[0] for p in pairs], [p[1] for p in pairs])
    a, b = await snapshot(views, job_a), await snapshot(views, job_b)
    for key in ("state", "exit_code", "reason", "tasks", "spec"):
        assert a[key] == b[key], key
    assert len(await views.history(job_b)) == len(events_b)  # no duplicate history rows


async def test_list_filters_and_pages_newest_first(views: JobViews) -> None:
    user = "u" + uuid.uuid4().hex[:6]
    ids = []
    for i in range(5):
        job = uuid.uuid4().hex
        ids.append(job)
        submitted = lifecycle(job)[0]
        submitted = submitted.model_copy(update={
            "spec": submitted.spec.model_copy(update={"user": user}),
            "occurred_at": submitted.occurred_at + timedelta(seconds=i)})
        await apply_all(views, [submitted], [i + 1])
    items, total = await views.list_jobs(user=user, state=None, limit=2, offset=1)
    assert total == 5 and [i["id"] for i in items] == [ids[3], ids[2]]
    items, total = await views.list_jobs(user=user, state="RUNNING", limit=10, offset=0)
    assert total == 0 and items == []
