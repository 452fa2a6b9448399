"""The status service as real processes on the MongoDB wire (FerretDB here, MongoDB when
MONGO_URL is set): two replicas sharing its consumer, each storing a fetched batch as a
unit of work (mongo_batch.py), project every job of the stream exactly as one event at a
time would, with every event delivered twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from trainyard_common.bus import Bus
from trainyard_common.events import encode
from trainyard_common.storage import mongo_client
from trainyard_common.subjects import subject_for
from trainyard_status.adapters.views import JobViews
from trainyard_status.domain.projection import project

from .placement_replicas import Replica
from .test_status_views import interrupted, lifecycle, snapshot


async def test_two_replicas_batching_on_mongodb_project_as_one_event_at_a_time(
    replica_env: dict[str, str], bus: Bus, mongo_url: str, db_prefix: str, tmp_path: Path
) -> None:
    jobs = [uuid.uuid4().hex for _ in range(12)]
    events = [e for job in jobs[:8] for e in lifecycle(job)]
    events += [e for job in jobs[8:] for e in interrupted(job)]
    # Each event published twice under different message ids: two deliveries, either
    # replica may get either, in batches of any mix of jobs.
    await bus.publish_all(events)
    for event in events:
        headers = {"Nats-Msg-Id": f"again-{event.event_id}"}
        await bus.js.publish(subject_for(event), encode(event), headers=headers)
    replicas = [
        Replica(replica_env, tmp_path / f"status-{i}.log", service="status").start()
        for i in range(2)
    ]
    client = mongo_client(mongo_url)
    try:
        # The same events applied one at a time, in a database of the test's own.
        reference = JobViews(client[f"{db_prefix}_reference"])
        for seq, event in enumerate(events, 1):
            await reference.record(event, seq, None)
            await reference.apply(project(event), seq)
        wanted = {job: await view_of(reference, job) for job in jobs}
        stored = JobViews(client[f"{db_prefix}_status"])
        deadline = time.monotonic() + 60
        while True:
            got = {job: await view_of(stored, job) for job in jobs}
            if got == wanted:
                break
            assert time.monotonic() < deadline, (
                [job for job in jobs if got[job] != wanted[job]],
                [r.log()[-2000:] for r in replicas],
            )
            await asyncio.sleep(0.2)
        for i, job in enumerate(jobs):  # and through the service's API, either replica
            page = replicas[i % 2].http.get(f"/v1/jobs/{job}").json()
            shown = [(t["index"], t["state"], t["exit_code"]) for t in page["tasks"]]
            want = wanted[job]
            assert want is not None and page["state"] == want["state"]
            assert shown == [(t["index"], t["state"], t["exit_code"]) for t in want["tasks"]]
        for name in (f"{db_prefix}_reference", f"{db_prefix}_status"):
            await client.drop_database(name)
    finally:
        await client.close()
        for replica in replicas:
            replica.stop()


async def view_of(views: JobViews, job: str) -> dict | None:
    """What a job's page shows that the projection decides, with its history's length."""
    if await views.get_job(job) is None:
        return None
    view = await snapshot(views, job)
    keys = ("state", "reason", "exit_code", "tasks", "attempts", "spec")
    return {**{key: view[key] for key in keys}, "history": len(await views.history(job))}
