"""Status queries at scale: the status service's own adapter (JobViews) on the embedded
SQLite store filled with N jobs, against the same adapter on the embedded FerretDB (the
previous default) with fewer jobs, in the same run.

    .venv/bin/python bench/store_scale.py [--jobs 1000000] [--baseline-jobs 10000]

Each job is a document as the projection writes it (spec and original payload as JSON
text, about 1.5 kB), with one task, three history rows and three labels (each a document
of the labels' index too); users, states, dialects and queues vary, submission times
spread over a year. Measured per query kind, ``--repeat`` times with random arguments:
p50 and p99 in milliseconds. Also measured: the cost of
projecting one more job's events (insert, then state moves) at the end, against the
same on a store of 100 jobs, for "no stage's cost grows with history". Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from trainyard_common.contracts import example_events
from trainyard_common.dialects import dlc
from trainyard_common.docstore import SqliteClient, SqliteDatabase
from trainyard_common.events import JobQueued, JobSubmitted
from trainyard_common.storage import Client, mongo_client
from trainyard_stack.components import FerretDB, ensure_ferretdb_binary
from trainyard_status.adapters.views import JobViews, label_rows
from trainyard_status.domain.projection import project

USERS = [f"user{i:03d}" for i in range(200)]
STATES = ["SUCCEEDED"] * 80 + ["FAILED"] * 10 + ["STOPPED"] * 4 + ["RUNNING"] * 3 + ["QUEUED"] * 3
DIALECTS = ["openpai_v2", "native", "t9k", "kubeflow", "dlc", "ti"]
QUEUES = ["default", "vc-a", "vc-b", "vc-c"]
T0 = datetime(2025, 11, 1, tzinfo=UTC)
# OpenPAI's state RUNNING as its list filters it (dialect_api/openpai.py's STATES).
OPENPAI_RUNNING = {"$and": [{"$or": [{"state": "RUNNING", "stop_requested_by": None}]}]}
# Filters beside a name prefix: common and rare states, a queue, a dialect.
FILTERS = [{"state": "FAILED"}, {"state": "QUEUED"}, {"queue": "vc-a"}, {"dialect": "t9k"}]
SPEC = json.dumps(
    {
        "name": "train",
        "roles": [{"name": "worker", "replicas": 2, "command": "python train.py " + "x" * 300}],
        "env": [{"name": f"V{i}", "value": "y" * 20} for i in range(10)],
    }
)


def job_doc(i: int, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    job_id = f"{i:08d}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
    user = rng.choice(USERS)
    state = rng.choice(STATES)
    at = T0 + timedelta(seconds=i * 30 + rng.random())
    doc = {
        "_id": job_id,
        "name": f"job-{i}",
        "user": user,
        "state": state,
        "state_rank": 5,
        "dialect": rng.choice(DIALECTS),
        "dialect_key": f"{user}~job-{i}",
        "queue": rng.choice(QUEUES),
        "priority": 0,
        "submitted_at": at,
        "updated_at": at + timedelta(seconds=40),
        "finished_at": at + timedelta(seconds=40),
        "reason": None,
        "attempt": 1,
        "attempts": [],
        "spec_json": SPEC,
        "original_json": SPEC,
        # A label of 50,000 jobs across the year, one of 100, one of the oldest 250,000.
        "labels": {"team": f"t{i % 20}", "run": f"r{i // 100}", "era": f"e{i // 250_000}"},
    }
    task = {
        "_id": f"{job_id}:1:worker:0",
        "job_id": job_id,
        "attempt": 1,
        "role": "worker",
        "index": 0,
        "state": "SUCCEEDED",
        "seq": 3,
        "node": "n1",
        "exit_code": 0,
    }
    events = [
        {
            "_id": f"{job_id}-e{k}",
            "job_id": job_id,
            "seq": k,
            "type": "JobSubmitted",
            "occurred_at": at,
            "trace_id": None,
            "event_json": '{"event_id": "x"}',
        }
        for k in range(3)
    ]
    return doc, task, events


async def fill_sqlite(db: SqliteDatabase, jobs: int, batch: int = 5000) -> float:
    rng = random.Random(42)
    start = time.perf_counter()
    for first in range(0, jobs, batch):
        with db.transaction():
            for i in range(first, min(first + batch, jobs)):
                doc, task, events = job_doc(i, rng)
                db["jobs"]._insert(doc)
                for row in label_rows(doc["_id"], doc):
                    db["labels"]._insert(row)
                db["tasks"]._insert(task)
                for event in events:
                    db["events"]._insert(event)
    return time.perf_counter() - start


async def fill_mongo(client: Client, name: str, jobs: int) -> float:
    rng = random.Random(42)
    db = client[name]
    start = time.perf_counter()
    docs: dict[str, list[Any]] = {"jobs": [], "tasks": [], "events": [], "labels": []}
    for i in range(jobs):
        doc, task, events = job_doc(i, rng)
        docs["jobs"].append(doc)
        docs["labels"].extend(label_rows(doc["_id"], doc))
        docs["tasks"].append(task)
        docs["events"].extend(events)
    for collection, items in docs.items():
        for first in range(0, len(items), 1000):
            await db[collection].insert_many(items[first : first + 1000])  # type: ignore[union-attr]
    return time.perf_counter() - start


async def timed(repeat: int, call: Callable[[random.Random], Awaitable[Any]]) -> dict[str, float]:
    rng = random.Random(7)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await call(rng)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[max(0, int(len(times) * 0.99) - 1)], 2),
    }


async def queries(views: JobViews, jobs: int, repeat: int) -> dict[str, Any]:
    def some_job(rng: random.Random) -> str:
        i = rng.randrange(jobs)
        # Ids are "<i>-<random>": find it by its prefix the way a client has it (an id).
        return ids[i]

    ids: list[str] = []
    # The ids, in order, without holding documents: read back through the adapter's store.
    rng = random.Random(42)
    for i in range(jobs):
        ids.append(job_doc(i, rng)[0]["_id"])

    async def page(**kwargs: Any) -> None:
        items, total = await views.list_jobs(**kwargs)
        assert len(items) <= total

    async def page_of(user: str | None, where: dict[str, Any]) -> None:
        """A page as /v1/jobs reads it: the jobs, then the bounded total."""
        items, _ = await views.list_jobs(
            user=user, state=None, limit=50, offset=0, where=dict(where), count=False
        )
        total = await views.count_jobs(user=user, state=None, where=dict(where))
        assert total is None or len(items) <= total

    async def listing(user: str | None, prefix: str) -> None:
        await page_of(user, {"name": {"$gte": prefix, "$lt": prefix + "\U0010ffff"}})

    async def openpai(more: dict[str, Any]) -> None:
        """OpenPAI's list as its API reads it: whole documents, and the exact total."""
        where = {"dialect": {"$in": ["openpai_v2", "native"]}, **more}
        await page(user=None, state=None, limit=20, offset=0, where=where, full=True)

    async def dlc_list(rng: random.Random, admin: bool) -> None:
        """DLC's ListJobs as its API reads it (dialect_api/dlc.py): a time window (its
        default, the last 7 days; 90 days; an admin's, the year), with a Status or
        not, whole documents and the exact total; now is the newest job's time."""
        newest = T0 + timedelta(seconds=jobs * 30)
        params = {}
        days = rng.choice([7, 90, 400] if admin else [7, 90])
        if days != 7:
            params["StartTime"] = (newest - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")
        if admin or rng.random() < 0.5:
            params["Status"] = rng.choice(["Running", "Failed", "Queuing"])
        query = dlc.list_query(params, user=rng.choice(USERS), admin=admin, now=newest)
        await page(
            user=None, state=None, limit=50, offset=0, where=query.where, full=True,
            oldest_first=query.ascending, sort=query.sort,
        )  # fmt: skip

    def old_names(rng: random.Random) -> dict[str, str]:
        """One of "job-1" to "job-5" (111,111 jobs each) as a name filter."""
        prefix = f"job-{rng.randrange(1, 6)}"
        return {"$gte": prefix, "$lt": prefix + "\U0010ffff"}

    return {
        "list_newest_page": await timed(
            repeat, lambda r: page(user=None, state=None, limit=50, offset=50 * r.randrange(20))
        ),
        "list_by_user": await timed(
            repeat,
            lambda r: page(user=r.choice(USERS), state=None, limit=50, offset=0),
        ),
        "list_by_state": await timed(
            repeat,
            lambda r: page(
                user=None, state=r.choice(["RUNNING", "FAILED", "QUEUED"]), limit=50, offset=0
            ),
        ),
        "list_openpai_filters": await timed(
            repeat,
            lambda r: openpai(
                {"user": {"$in": [r.choice(USERS)]}, "queue": {"$in": ["default", "vc-a"]}}
            ),
        ),
        # OpenPAI's list of every user's jobs (an admin's) with its exact total
        # (withTotalCount), by a virtual cluster or a state as its web portal filters.
        "list_openpai_admin": await timed(
            repeat,
            lambda r: openpai(r.choice([{"queue": {"$in": [r.choice(QUEUES)]}}, OPENPAI_RUNNING])),
        ),
        # DLC's lists of a time window: one user's, an admin's by a state.
        "list_dlc_user": await timed(repeat, lambda r: dlc_list(r, admin=False)),
        "list_dlc_admin": await timed(repeat, lambda r: dlc_list(r, admin=True)),
        # Name prefixes (/v1/jobs?name=): of a few jobs ("job-12345": 11 of 1,000,000),
        # of every job, of 111,111 old jobs under 400,000 newer or more ("job-1" to
        # "job-5": a walk in the page's order finds none for long), and one user's.
        "list_name_few": await timed(
            repeat, lambda r: listing(None, f"job-{r.randrange(10_000, 100_000)}")
        ),
        "list_name_every": await timed(repeat, lambda r: listing(None, "job-")),
        "list_name_old": await timed(repeat, lambda r: listing(None, f"job-{r.randrange(1, 6)}")),
        # ... the same old ones beside another filter, as the console's state or a
        # queue: a walk of that filter's index reads each of its newer jobs first.
        "list_name_old_filtered": await timed(
            repeat,
            lambda r: page_of(None, {"name": old_names(r), **r.choice(FILTERS)}),
        ),
        "list_name_by_user": await timed(
            repeat, lambda r: listing(r.choice(USERS), f"job-{r.randrange(1, 10)}")
        ),
        # Labels (/v1/jobs?label=): of 100 jobs, of 50,000 across the year, one user's
        # (of 100: none to a few), and of the oldest 250,000, under 750,000 newer (a
        # walk in the page's order reads those first: a few runs only).
        "list_label_few": await timed(
            repeat, lambda r: page_of(None, {"labels.run": f"r{r.randrange(jobs // 100)}"})
        ),
        "list_label_common": await timed(
            repeat, lambda r: page_of(None, {"labels.team": f"t{r.randrange(20)}"})
        ),
        "list_label_by_user": await timed(
            repeat,
            lambda r: page_of(r.choice(USERS), {"labels.run": f"r{r.randrange(jobs // 100)}"}),
        ),
        "list_label_old": await timed(
            min(repeat, 5), lambda r: page_of(None, {"labels.era": "e0"})
        ),
        "job_page": await timed(
            repeat,
            lambda r: _job_page(views, some_job(r)),
        ),
        "history": await timed(repeat, lambda r: views.history(some_job(r))),
    }


async def _job_page(views: JobViews, job_id: str) -> None:
    doc = await views.get_job(job_id)
    assert doc is not None
    await views.job_tasks(job_id)


async def project_one_job(views: JobViews, repeat: int) -> dict[str, float]:
    """What one more job costs to project: its events from submission to running."""
    kinds = {type(e).__name__: e for e in example_events()}
    names = ["JobSubmitted", "JobAccepted", "JobQueued", "JobPlaced", "TaskStateChanged"]

    async def one(_: random.Random) -> None:
        job_id = uuid.uuid4().hex
        for seq, name in enumerate(names, 1):
            event = kinds[name].model_copy(update={"job_id": job_id, "event_id": uuid.uuid4().hex})
            if isinstance(event, JobSubmitted | JobQueued):
                event = event.model_copy(update={"occurred_at": datetime.now(UTC)})
            await views.record(event, seq, None)
            await views.apply(project(event))

    return await timed(repeat, one)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"jobs": args.jobs, "baseline_jobs": args.baseline_jobs}
    with tempfile.TemporaryDirectory() as tmp:
        small = SqliteClient(Path(tmp) / "small")
        small_views = JobViews(small["status"])
        await small_views.ensure_indexes()
        await fill_sqlite(small["status"], 100)
        result["sqlite_project_one_job_at_100"] = await project_one_job(small_views, args.repeat)
        await small.close()

        client = SqliteClient(Path(tmp) / "big")
        views = JobViews(client["status"])
        await views.ensure_indexes()
        result["sqlite_fill_s"] = round(await fill_sqlite(client["status"], args.jobs), 1)
        result["sqlite_file_mb"] = round(
            (Path(tmp) / "big" / "status.sqlite3").stat().st_size / 2**20
        )
        result["sqlite"] = await queries(views, args.jobs, args.repeat)
        result["sqlite_project_one_job_at_n"] = await project_one_job(views, args.repeat)
        await client.close()

        if args.baseline_jobs:
            ensure_ferretdb_binary()
            server = FerretDB(Path(tmp) / "ferretdb").start()
            mongo = mongo_client(server.url)
            try:
                base = JobViews(mongo["status"])
                await base.ensure_indexes()
                result["ferretdb_fill_s"] = round(
                    await fill_mongo(mongo, "status", args.baseline_jobs), 1
                )
                result["ferretdb"] = await queries(base, args.baseline_jobs, args.baseline_repeat)
            finally:
                await mongo.close()
                server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--baseline-jobs", type=int, default=10_000)
    parser.add_argument("--baseline-repeat", type=int, default=10)
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
