"""The read model in the store (SQLite or MongoDB): ``jobs`` (current view), ``tasks``
and ``events`` (the full history). Every write is safe to repeat: history rows are keyed by event id, job states
only move to a higher rank, task transitions only to a higher ``seq``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

from pymongo import ASCENDING, DESCENDING

from trainyard_common.dialects import BY_NAME
from trainyard_common.events import Event, JobState, TaskState, decode
from trainyard_common.jobspec import REDACTED
from trainyard_common.storage import (
    TIMEOUTS,
    Database,
    copy_key,
    count_within,
    day_key,
    day_text,
    drop_old_index,
    insert_all_once,
    insert_once,
    needs_hints,
    preload,
)

from ..domain.projection import Changes, EndTasks, JobChange, TaskChange, project


def _order_keys(change: JobChange) -> dict[str, str]:
    """Where each of the change's ordered groups keeps the order that last wrote it."""
    return {
        **{group: f"{group}_seq" for group in change.ordered},
        **{group: f"{group}_rank" for group in change.ranked},
    }


def _tag_digest(tag: str) -> str:
    """A tag as a field name (tags may hold dots and dollars; field names may not)."""
    return hashlib.sha256(tag.encode()).hexdigest()[:24]


def _ordered_sets(
    change: JobChange, seq: int | None
) -> list[tuple[str, int | None, dict[str, Any]]]:
    """Each ordered group of the change: (its order's key, its order, the fields to set
    with the order). No order for a seq group of an event replayed outside the stream:
    written as before."""
    keys = _order_keys(change)
    groups = [(g, seq, f) for g, f in change.ordered.items()]
    groups += [(g, change.rank, f) for g, f in change.ranked.items()]
    return [
        (keys[g], order, {**fields, **({keys[g]: order} if order is not None else {})})
        for g, order, fields in groups
    ]


# The fields a job list filters on by equality, each leading an index (ensure_indexes).
LIST_FILTERS = ("user", "state", "queue", "dialect", "kind")
# A list's total is counted up to this many jobs, for at most this long (count_jobs).
COUNT_MOST = 10_000
COUNT_BUDGET_MS = 20
# ... and its counts by state (?counts=true), all of them together.
COUNTS_BUDGET_MS = 50
# A list filtered by a name (a prefix) matching at most this many jobs reads them through
# the name's index and sorts them; one matching more walks the page's order, for at most
# NAME_WALK_MS (list_jobs's _plans) ...
NAME_SORTED_MOST = 2000
NAME_WALK_MS = 5
NEWEST = [("submitted_at", DESCENDING), ("_id", DESCENDING)]
# The submission's UTC day (the embedded store's own key): when that walk gives up, a
# name's matches are read day by day in the page's order (list_jobs's _plans) ...
SUBMITTED_DAY = day_key("submitted_at")
# ... where the jobs span at most this many days (one search of the index a day).
DAYS_MOST = 5000
# What a dialect's list filters by (OpenPAI's users, virtual clusters and states), each
# copied to a key of its own on the embedded store, with an index over the copies that
# a count of such a list reads alone (_counted) ...
COUNTED = ("dialect", "user", "queue", "state", "stop_requested_by")
COPIES = [(copy_key(f), ASCENDING) for f in COUNTED]
# ... and another for a list of a time window (DLC's: the last 7 days by default), the
# window's range searched in it: the submission time in the index above made it a
# third wider, and an admin's count of a virtual cluster (all of OpenPAI's) as slower.
WINDOWED = [(copy_key(f), ASCENDING) for f in ("dialect", "submitted_at", "user", "state")]

# A job as its dialect's API names it (find_by_key, resources): a user's and a name.
BY_KEY = [("user", ASCENDING), ("dialect_key", ASCENDING)]
# What changed after a stream sequence (changed_since), of one dialect (resource_changes).
BY_CHANGE = [("feed_seq", ASCENDING)]
BY_DIALECT_CHANGE = [("dialect", ASCENDING), ("feed_seq", ASCENDING)]

# The fields only JobSubmitted sets on a job, always with a state: a job holding one is
# never one seen only in part (domain/projection.py; tests/unit/test_status_projection.py).
SUBMITTED_FIELDS = frozenset(
    {"user", "name", "queue", "dialect", "dialect_key", "kind", "labels", "submitted_at"}
)


# An index to read, by its keys (None: the store's choice).
Hint = list[tuple[str, int]] | None


class Plan(NamedTuple):
    """A way to read a list page (list_jobs's _plans): through the index ``hint`` names
    (None: the store's choice), for at most ``max_ms`` (None: to its end), and, with
    ``days`` (the first and last day any job was submitted), one day at a time."""

    hint: Hint = None
    max_ms: int | None = None
    days: tuple[date, date] | None = None


class JobViews:
    def __init__(self, db: Database) -> None:
        self.jobs = db["jobs"]
        self.tasks = db["tasks"]
        self.events = db["events"]
        # A job's labels, a document each (label_rows): what no index of the jobs holds.
        self.labels = db["labels"]
        self.meta = db["meta"]
        # Whether every job's labels are there (fill_labels): until then a label filter
        # walks the jobs, as before them.
        self.labels_ready = False

    async def ensure_indexes(self) -> None:
        # A list page is newest first, ties by id: both in the index, so a page is read
        # in index order and nothing is sorted.
        newest = NEWEST
        # Each filter by equality a list takes (app.py's /v1/jobs; the dialects' lists
        # by queue and dialect) leads an index of its own, so a filtered page is a walk
        # of its matches alone, already in order: walking the newest-first index instead
        # and testing each job read every job for a rare value (a queue of a few jobs:
        # 0.6 s at 100,000 jobs).
        for field in LIST_FILTERS:
            await self.jobs.create_index([(field, ASCENDING), *newest])
        # A user's jobs in one state: every list but an admin's filtered by state, and
        # the counts by state beside it (the console's), a search of this index alone
        # (the user's index read each job: 55 ms for a user of 5,000 jobs, 1M in all).
        await self.jobs.create_index([("user", ASCENDING), ("state", ASCENDING), *newest])
        await self.jobs.create_index(newest)
        # A name prefix (/v1/jobs?name=), every user's or one's (list_jobs's
        # _plans): a walk of the jobs testing each read all of them for a rare one
        # (1,000,000 jobs: 4-8 s).
        await self.jobs.create_index([("name", ASCENDING), *newest])
        await self.jobs.create_index([("user", ASCENDING), ("name", ASCENDING), *newest])
        if needs_hints(self.jobs):
            # The same, a day at a time: a prefix of many old jobs, under many newer
            # ones, sorted each of its matches in the name's index (1,000,000 jobs, a
            # prefix of 111,111: 30 ms), and more for more (_plans).
            for mine in ([], [("user", ASCENDING)]):
                await self.jobs.create_index(
                    [*mine, (SUBMITTED_DAY, DESCENDING), ("name", ASCENDING), *newest]
                )
        await self.jobs.create_index(BY_KEY)
        if needs_hints(self.jobs):
            # A dialect's list's exact total (OpenPAI's withTotalCount) tested its
            # other filters in each match's document: a virtual cluster's 83,000 of
            # 1,000,000 jobs, 0.75 s warm, 4.7 s from disk (_counted).
            await self.jobs.create_index(COPIES)
            # DLC's window was tested in each document (an admin's failed jobs of 90
            # days: 147 ms; of the year, 0.6 s).
            await self.jobs.create_index(WINDOWED)
        # The live feed's walk over what changed (adapters/feed.py), and a watch's of
        # one dialect (resource_changes).
        await self.jobs.create_index(BY_CHANGE)
        await self.jobs.create_index(BY_DIALECT_CHANGE)
        # A job's tasks in the order its pages list them (job_tasks): a page is a walk
        # of the index, not a sort of every task of the job (up to 100,000).
        await self.tasks.create_index(
            [
                ("job_id", ASCENDING),
                ("attempt", ASCENDING),
                ("role", ASCENDING),
                ("index", ASCENDING),
            ]
        )
        # The tasks' index by job alone, before the one above (until 2026-11-29): a store
        # made then still updated it at every write of a task.
        await drop_old_index(self.tasks, [("job_id", ASCENDING)])
        await self.events.create_index([("job_id", ASCENDING), ("seq", ASCENDING)])
        # A label filter (/v1/jobs?label=): a page of the label's own documents in the
        # page's order, then its jobs by id (list_jobs); with other filters, few matches
        # read by id (_by_label). A rare one walked every job (1,000,000: 2.7 s).
        by_time = [("submitted_at", DESCENDING), ("job_id", DESCENDING)]
        await self.labels.create_index([("pair", ASCENDING), *by_time])
        await self.labels.create_index([("pair", ASCENDING), ("user", ASCENDING), *by_time])
        self.labels_ready = await self.meta.find_one({"_id": "labels"}) is not None
        if not self.labels_ready and await self.jobs.find_one({}, {"_id": 1}) is None:
            # A new store: every job will come with its labels.
            await insert_once(self.meta, {"_id": "labels", "filled": 0})
            self.labels_ready = True

    # -- writes ---------------------------------------------------------------------------

    async def fill_labels(
        self, stop: asyncio.Event | None = None, page: int = 200, catch_up_s: float = 60.0
    ) -> int:
        """The label rows of the jobs projected before they were kept (a store made
        before 2026-11-29), once: a marker in ``meta`` says it was done. Run beside the
        service (minutes at 1,000,000 jobs: longer than a start may take), a page of
        jobs at a time in id order with the event loop free between pages, from where a
        stopped fill left off; how many rows it wrote.

        Then, for a rolling upgrade: a job a replica of the version before projected
        meanwhile has no rows, so the jobs submitted since the fill began are read
        again ``catch_up_s`` after it, and five and fifteen times that."""
        if await self.meta.find_one({"_id": "labels"}) is not None:
            self.labels_ready = True
            return 0
        began = datetime.now(UTC) - timedelta(minutes=1)
        progress = await self.meta.find_one({"_id": "labels_fill"}) or {}
        written, last = 0, progress.get("after")
        while stop is None or not stop.is_set():
            await asyncio.sleep(0)  # the requests and the projection between pages
            after: dict[str, Any] = {"_id": {"$gt": last}} if last is not None else {}
            added, last = await self._fill_page(after, page)
            written += added
            if last is None:
                break
            await self.meta.update_one(
                {"_id": "labels_fill"}, {"$set": {"after": last}}, upsert=True
            )
        else:
            return written
        await insert_once(self.meta, {"_id": "labels", "filled": written})
        self.labels_ready = True
        for wait in (catch_up_s, 4 * catch_up_s, 10 * catch_up_s):
            if stop is not None:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    break
                except TimeoutError:
                    pass
            since = {"submitted_at": {"$gte": began}}
            last = None
            while True:
                after = {**since, **({"_id": {"$gt": last}} if last is not None else {})}
                added, last = await self._fill_page(after, page)
                written += added
                if last is None:
                    break
        return written

    async def _fill_page(self, query: dict[str, Any], page: int) -> tuple[int, Any]:
        """One page of ``fill_labels``: the rows of up to ``page`` jobs of ``query`` in
        id order; how many were new, and the page's last id (None: the last page)."""
        cursor = self.jobs.find(query, {"labels": 1, "user": 1, "submitted_at": 1})
        docs = [doc async for doc in cursor.sort([("_id", ASCENDING)]).limit(page)]
        rows = [row for doc in docs for row in label_rows(doc["_id"], doc)]
        added = await insert_all_once(self.labels, rows)
        return added, (docs[-1]["_id"] if len(docs) == page else None)

    async def preload(self, events: list[Event]) -> None:
        """What a batch of ``events`` will read by ``_id``, read at once: on MongoDB
        inside a consumer's batch, one query per collection instead of a few per event
        (storage.preload); nothing on the embedded store."""
        await preload(self.events, [event.event_id for event in events])
        await preload(self.jobs, [event.job_id for event in events])
        tasks = [task.task_id for event in events for task in project(event).tasks]
        await preload(self.tasks, tasks)
        rows = [
            row["_id"]
            for event in events
            if (job := project(event).job) is not None and job.created
            for row in label_rows(job.job_id, job.always)
        ]
        await preload(self.labels, rows)

    async def record(self, event: Event, seq: int, trace_id: str | None) -> bool:
        """Append to the history; False when this event is already there."""
        return await insert_once(
            self.events,
            {
                "_id": event.event_id,
                "job_id": event.job_id,
                "seq": seq,
                "type": type(event).__name__,
                "occurred_at": event.occurred_at,
                "trace_id": trace_id,
                # Stored without secret values: history is for reading.
                "event_json": json.dumps(hide_secrets(json.loads(event.model_dump_json()))),
            },
        )

    async def apply(self, changes: Changes, seq: int | None = None) -> None:
        """``seq``: the event's stream sequence, kept on the job as ``feed_seq`` by the
        writes that change it (the live feed follows it: adapters/feed.py)."""
        if changes.job is not None:
            await self._apply_job(changes.job, seq)
            if changes.job.created:
                for row in label_rows(changes.job.job_id, changes.job.always):
                    await insert_once(self.labels, row)  # set once, as the job's labels
        for task in changes.tasks:
            await self._apply_task(task)
        if changes.end_tasks is not None:
            await self._end_tasks(changes.end_tasks)
        if changes.touched is not None and seq is not None:
            # Forward only ($lt: a job already fed this or a later event is not
            # written again, and one not there yet is left to its JobSubmitted).
            await self.jobs.update_one(
                {"_id": changes.touched, "feed_seq": {"$lt": seq}}, {"$set": {"feed_seq": seq}}
            )

    # Reads by _id are cheap in every store; FerretDB v1's updates cost time in proportion
    # to the collection's size (bench/README.md). So each write is preceded by a read, and
    # only what would change is written: a new document is inserted whole, and a state
    # that would not move is not written at all. The guards stay in the update filters,
    # so a second status replica writing meanwhile is still safe.

    async def _apply_job(self, change: JobChange, seq: int | None = None) -> None:
        fed: dict[str, Any] = {"feed_seq": seq} if seq is not None else {}
        if change.created and seq is not None:
            fed["created_seq"] = seq
        state_set: dict[str, Any] = {}
        if change.state is not None:
            state_set = {
                "state": change.state.value,
                "state_rank": change.rank,
                **change.with_state,
                **fed,
            }
        groups = _ordered_sets(change, seq)
        read = {"state_rank": 1, "created_seq": 1, **{key: 1 for key, _, _ in groups}}
        tag_key = f"tag_seq.{_tag_digest(change.tag)}" if change.tag is not None else None
        if tag_key is not None:
            read["tag_seq"] = 1  # the whole map: the SQLite store projects no dotted path
        current = await self.jobs.find_one({"_id": change.job_id}, read)
        if current is None:
            document = {
                "_id": change.job_id,
                "state_rank": -1,
                "state": None,
                **change.always,
                **{k: v for _, _, fields in groups for k, v in fields.items()},
                **state_set,
                **{key: [value] for key, value in change.add_to_set.items()},
                **fed,
            }
            if tag_key is not None and seq is not None:
                document["tag_seq"] = {tag_key.split(".", 1)[1]: seq}
            if await insert_once(self.jobs, document):
                return
            current = await self.jobs.find_one({"_id": change.job_id}, read) or {}
        # The first event's fields are set once: applied again (a redelivery) it would
        # only move feed_seq back, and a listener would be sent a change that is none.
        repeat = change.created and current.get("created_seq") is not None
        if change.always and not repeat:
            await self.jobs.update_one({"_id": change.job_id}, {"$set": {**change.always, **fed}})
        for key, order, fields in groups:
            if order is None:
                await self.jobs.update_one({"_id": change.job_id}, {"$set": fields})
                continue
            stored = current.get(key)
            if stored is not None and stored >= order:
                continue  # a later event wrote this group already
            # Guarded in the filter too, for another replica writing meanwhile; a group
            # none wrote yet (or a view from before the orders) is written as it is:
            # "$lt" never matches a missing field, and "$or" would make a MongoDB batch
            # send what it holds at once.
            newer = {key: {"$lt": order}} if stored is not None else {}
            await self.jobs.update_one({"_id": change.job_id, **newer}, {"$set": {**fields, **fed}})
        sets: dict[str, Any] = {}
        if change.add_to_set:
            sets["$addToSet"] = change.add_to_set
        if change.pull:
            sets["$pull"] = change.pull
        guard: dict[str, Any] = {}
        if tag_key is not None and seq is not None and sets:
            stored = (current.get("tag_seq") or {}).get(tag_key.split(".", 1)[1])
            if stored is not None and stored >= seq:
                sets = {}  # a later event changed this tag already
            else:
                guard = {tag_key: {"$lt": seq}} if stored is not None else {}
                sets["$set"] = {tag_key: seq, **fed}  # the live feed sends the new tags
        if sets:
            await self.jobs.update_one({"_id": change.job_id, **guard}, sets)
        if change.state is None:
            return
        stored = current.get("state_rank", -1)
        if stored > change.rank or (stored == change.rank and not change.same_rank_ok):
            return
        op = "$lte" if change.same_rank_ok else "$lt"
        await self.jobs.update_one(
            {"_id": change.job_id, "state_rank": {op: change.rank}}, {"$set": state_set}
        )

    async def _apply_task(self, change: TaskChange) -> None:
        current = await self.tasks.find_one({"_id": change.task_id}, {"seq": 1})
        if current is None:
            fields = dict(change.fields)
            if change.seq is None:
                fields.update(seq=0, state="PENDING")
            else:
                fields["seq"] = change.seq
            if await insert_once(self.tasks, {"_id": change.task_id, **fields}):
                return
            current = await self.tasks.find_one({"_id": change.task_id}, {"seq": 1}) or {}
        if change.seq is None:
            # Placement fields never race a transition: set them whatever the seq.
            await self.tasks.update_one({"_id": change.task_id}, {"$set": change.fields})
            return
        if current.get("seq", 0) >= change.seq:
            return  # the task already holds this or a later transition
        await self.tasks.update_one(
            {"_id": change.task_id, "seq": {"$lt": change.seq}},
            {"$set": {**change.fields, "seq": change.seq}},
        )

    async def _end_tasks(self, change: EndTasks) -> None:
        await self.tasks.update_many(
            {
                "job_id": change.job_id,
                "attempt": change.attempt,
                "state": {"$nin": [s.value for s in TaskState if s.terminal]},
            },
            {"$set": change.fields},
        )

    # -- reads ----------------------------------------------------------------------------

    async def list_jobs(
        self,
        *,
        user: str | None,
        state: str | None,
        limit: int,
        offset: int,
        where: dict[str, Any] | None = None,
        full: bool = False,
        after: tuple[datetime, str] | None = None,
        oldest_first: bool = False,
        sort: str = "submitted_at",
        count: bool = True,
    ) -> tuple[list[dict[str, Any]], int]:
        """Jobs newest first (``oldest_first``: the other way), or by another stored
        field (``sort``: a dialect's list order; then the id breaks ties). ``where`` adds
        filters on stored fields (a dialect's API narrows by dialect or queue); ``full``
        returns whole documents. ``after``: the (submitted_at, id) of the last job of the
        page before (a cursor: pages stay right while jobs are written; no ``offset``
        then, nor another ``sort``). ``count`` False: the total is not counted (0)."""
        query = _list_query(user, state, where)
        rows = _label_rows_query(query) if sort == "submitted_at" and self.labels_ready else None
        if rows is None:
            query = await self._by_label(query)
        if not count:
            total = 0
        elif rows is not None:
            total = await self.labels.count_documents(_rows_part(rows, query))
        elif query == {"state": {"$ne": None}}:
            # Every job but the few seen only in part: counting all of them reads the
            # smallest index, counting "state set" would read every document (1M jobs:
            # 10 ms against seconds; bench/store_scale.py).
            all_jobs = await self.jobs.count_documents({})
            total = all_jobs - await self.jobs.count_documents({"state": None})
        else:
            total = await self._count_all(query)
        projection = None if full else {"spec_json": 0, "original_json": 0}
        way = ASCENDING if oldest_first else DESCENDING
        order = [(sort, way), ("_id", way)]
        plans = [Plan()]
        if rows is None:
            plans = await self._plans(query, sort)

        async def find(part: dict[str, Any], skip: int, most: int) -> list[dict[str, Any]]:
            if rows is not None:
                # The page's ids from the label's own documents, in the page's order.
                by_label = self.labels.find(_rows_part(rows, part), {"job_id": 1})
                ordered = by_label.sort([("submitted_at", way), ("job_id", way)])
                ids = [row["job_id"] async for row in ordered.skip(skip).limit(most)]
                found = self.jobs.find({"_id": {"$in": ids}}, projection)
                docs = {doc["_id"]: doc async for doc in found}
                return [docs[job_id] for job_id in ids if job_id in docs]
            for plan in plans:  # the last one runs to its end
                matches, sort_by = part, order
                if plan.days is not None:
                    # The days the page may hold, in the index they lead: each day's
                    # matches are sorted alone, in the page's order, until it is full.
                    days = _days(*plan.days, part.get("submitted_at"))
                    matches = {**part, SUBMITTED_DAY: {"$in": days}}
                    sort_by = [(SUBMITTED_DAY, way), *order]
                cursor = self.jobs.find(matches, projection).sort(sort_by).skip(skip).limit(most)
                if plan.hint is not None:
                    cursor = cursor.hint(plan.hint)
                if plan.max_ms is not None:
                    cursor = cursor.max_time_ms(plan.max_ms)
                try:
                    return [doc async for doc in cursor]
                except TIMEOUTS:
                    continue
            raise AssertionError("the last plan has no time limit")

        if after is None:
            docs = await find(query, offset, limit)
        else:
            # Keyset: the rest of the cursor's second, then the seconds beyond it; each
            # a walk of the same index the first page used. Beside a submitted_before
            # (newest first) the tighter bound holds: the query's in place of the
            # cursor's gave the first page again, for ever.
            at, last = after
            beyond = "$gt" if oldest_first else "$lt"
            bounds = _and_bound(query.get("submitted_at"), beyond, at)
            docs = []
            for extra in (
                # Beside the query's own condition on the id (an id prefix, a rare
                # label's ids), which the cursor's replaced (found in review).
                {"submitted_at": at, "_id": _and_bound(query.get("_id"), beyond, last)},
                {"submitted_at": bounds},
            ):
                if len(docs) >= limit:
                    break
                part = {**query, **extra}
                docs += await find(part, 0, limit - len(docs))
        return [doc if full else summary(doc) for doc in docs], total

    async def _by_label(self, query: dict[str, Any]) -> dict[str, Any]:
        """``query`` with the ids of the jobs of one of its label filters, the first
        whose jobs are few (up to NAME_SORTED_MOST, counted in the labels' index): the
        store then reads them by id. No index of the jobs holds their labels, so a
        filter by a rare label walked every job (1,000,000 jobs: 2.7 s), beside a
        common label too; a common one alone finds a page soon in the walk, and is left
        to it."""
        labels = [(k, v) for k, v in query.items() if k.startswith("labels.")]
        if not labels or "_id" in query or not self.labels_ready:
            return query
        mine = {"user": query["user"]} if isinstance(query.get("user"), str) else {}
        for key, value in labels:
            if not isinstance(value, str):
                continue
            rows = {"pair": _pair(key.split(".", 1)[1], value), **mine}
            few = await count_within(self.labels, rows, NAME_SORTED_MOST + 1, COUNT_BUDGET_MS)
            if few is not None and few <= NAME_SORTED_MOST:
                ids = [row["job_id"] async for row in self.labels.find(rows, {"job_id": 1})]
                return {**query, "_id": {"$in": ids}}
        return query

    def _counted(self, query: dict[str, Any]) -> tuple[dict[str, Any], Hint]:
        """``query`` as a count reads it, and the index it names (None: the store's
        choice). On the embedded store, a dialect's list that tests nothing but
        COUNTED fields and a window names their copies, so the count is a walk of an
        index of copies alone (the index of the dialect read each match's document for
        the rest), unless one field's own index holds the whole query (a dialect and its
        window: a range of that index). A page's query never names the copies: SQLite
        would take such an index for a page too, and sort every match (ensure_indexes).
        Else a user's count walks the user's index (_lead)."""
        if not needs_hints(self.jobs):
            return query, None
        whole = [k for k in query if k != "submitted_at"]
        one = len(whole) == 1 and whole[0] in LIST_FILTERS and isinstance(query[whole[0]], str)
        if "dialect" in query and not one and (copied := _copies(query)) is not None:
            # Each named: SQLite takes either for either (a count of OpenPAI's virtual
            # cluster in the window's index read each of the dialect's documents, 1.3
            # s; a window in the other, each of a user's).
            return copied, (WINDOWED if "submitted_at" in query else COPIES)
        return query, self._lead(query)

    async def _count_all(self, query: dict[str, Any]) -> int:
        """How many jobs match ``query``, counted as ``_counted`` reads it."""
        counted, hint = self._counted(query)
        more: dict[str, Any] = {"hint": hint} if hint else {}
        return int(await self.jobs.count_documents(counted, **more))

    async def _count(self, query: dict[str, Any], most: int, budget_ms: int) -> int | None:
        """The same, up to ``most`` and within ``budget_ms`` (count_within)."""
        counted, hint = self._counted(query)
        return await count_within(self.jobs, counted, most, budget_ms, hint)

    def _lead(self, query: dict[str, Any]) -> Hint:
        """The index a user's list (the user by equality) is read in on the embedded
        store: the user's, with the state when that is one too. SQLite's planner, with
        no figures of how many jobs a value holds, took another filter's index as soon
        (a dialect's: a user's DLC jobs of 90 days, 1,000,000 in all, read every DLC job
        of those days, 178 ms; OpenPAI's user in one virtual cluster, its ``$in`` of one
        user, took the virtual cluster's: 36-124 ms). None (the store's choice) for any
        other list, and where ids or a name (or its prefix) are searched: their own
        indexes are narrower."""
        if not needs_hints(self.jobs) or _single(query.get("user")) is None:
            return None
        if "_id" in query or _named(query):
            return None
        by_state = isinstance(query.get("state"), str)
        if not [f for f in LIST_FILTERS[1:] if f in query and not (f == "state" and by_state)]:
            return None  # no other filter's index to take: the store's choice is the user's
        if by_state:
            return [("user", ASCENDING), ("state", ASCENDING), *NEWEST]
        return [("user", ASCENDING), *NEWEST]

    async def _plans(self, query: dict[str, Any], sort: str = "submitted_at") -> list[Plan]:
        """How a page of ``query`` in ``sort``'s order is read on the embedded store:
        the plans to try in turn. A user's list in the user's index (_lead). In
        submission order, by id or by name, whose planner cannot know how many jobs a
        name prefix holds: a walk in the page's order testing each job read all of
        them for a rare prefix (1,000,000 jobs: 4-8 s), and the name's index read every
        match of a common one with its document (125,000: 1.3 s) or, at best, sorted
        each match's id (111,111: 30 ms)."""
        name = query.get("name")
        by_id = query.get("_id")
        if isinstance(by_id, str) or (isinstance(by_id, dict) and "$in" in by_id):
            # Jobs by id (DLC's JobId, JobIds; a rare label's): a lookup of each, which
            # the store's planner may pass over for another filter's walk.
            return [Plan([("_id", ASCENDING)] if needs_hints(self.jobs) else None)]
        if not needs_hints(self.jobs) or sort != "submitted_at" or not _named(query):
            return [Plan(self._lead(query))]
        # One user's (every list but an admin's) in the index the user leads.
        mine = {"user": query["user"]} if isinstance(query.get("user"), str) else {}
        lead = [("user", ASCENDING)] if mine else []
        by_name = [*lead, ("name", ASCENDING), *NEWEST]
        # Counted up to a bound in that index alone.
        few = await count_within(
            self.jobs, {**mine, "name": name}, NAME_SORTED_MOST + 1, COUNT_BUDGET_MS
        )
        if few is not None and few <= NAME_SORTED_MOST:
            return [Plan(by_name)]
        # Many: the walk of the index the first filter by equality leads, as without a
        # name, finds a page soon unless the matches are all old.
        field = next((f for f in LIST_FILTERS if isinstance(query.get(f), str)), None)
        walk = [(field, ASCENDING), *NEWEST] if field else NEWEST
        if mine and isinstance(query.get("state"), str):
            walk = [("user", ASCENDING), ("state", ASCENDING), *NEWEST]  # both in one
        # When it gives up, the matches are read a day at a time in the page's order, in the
        # index the submission's day leads: each day's matches alone are sorted, and
        # the days before the page's never read (the prefix of 111,111 above: 1 ms).
        # Another filter (a state, a queue) is tested in the documents of the name's
        # matches: walking its own index read each of its newer jobs instead (a state
        # of 100,000 of 1,000,000 jobs: 0.3 s, 6 s from disk).
        span = await self._span()
        if span is not None and (span[1] - span[0]).days < DAYS_MOST:
            by_day = [*lead, (SUBMITTED_DAY, DESCENDING), ("name", ASCENDING), *NEWEST]
            return [Plan(walk, NAME_WALK_MS), Plan(by_day, None, span)]
        # Jobs over more days than DAYS_MOST: with no filter the name's index does not
        # hold, the matches' ids sorted in it; else the walk to its end.
        if set(query) <= {*mine, "name", "submitted_at", "_id"}:
            return [Plan(walk, NAME_WALK_MS), Plan(by_name)]
        return [Plan(walk)]

    async def _span(self) -> tuple[date, date] | None:
        """The first and last day a job was submitted (UTC; None: no job), each the end
        of the newest-first index; the last one today at the earliest: a replica
        sharing the file may store a job of a new day between this and the page."""
        ends = []
        for way in (ASCENDING, DESCENDING):
            found = self.jobs.find({"submitted_at": {"$ne": None}}, {"submitted_at": 1})
            first = [doc async for doc in found.sort([("submitted_at", way)]).limit(1)]
            if not first:
                return None
            ends.append(date.fromisoformat(day_text(first[0]["submitted_at"])))
        return ends[0], max(ends[1], datetime.now(UTC).date())

    async def count_jobs(
        self,
        *,
        user: str | None,
        state: str | None,
        where: dict[str, Any] | None = None,
        most: int = COUNT_MOST,
        budget_ms: int = COUNT_BUDGET_MS,
    ) -> int | None:
        """How many jobs ``list_jobs`` would list with these filters, counted up to
        ``most`` + 1 (that many: more than ``most``) and for at most ``budget_ms`` (None:
        the time ran out). Bounded either way: counting every match read each of them,
        and with a filter no index serves, every job (0.4-0.7 s at 100,000 jobs, the
        status process held meanwhile)."""
        query = _list_query(user, state, where)
        rows = _label_rows_query(query) if self.labels_ready else None
        if rows is not None:
            return await count_within(self.labels, _rows_part(rows, query), most + 1, budget_ms)
        query = await self._by_label(query)
        if query == {"state": {"$ne": None}}:
            # Every job but the few seen only in part: a walk of the smallest index up
            # to the bound ("state set" alone would read each job's document).
            partial = await count_within(self.jobs, {"state": None}, most + 1, budget_ms)
            if partial is None:
                return None
            every = await count_within(self.jobs, {}, most + 1 + partial, budget_ms)
            return None if every is None else every - partial
        return await self._count(query, most + 1, budget_ms)

    async def count_states_within(
        self, where: dict[str, Any], most: int = COUNT_MOST, budget_ms: int = COUNTS_BUDGET_MS
    ) -> tuple[dict[str, int], bool]:
        """``count_states`` for a list page (``?counts=true``): each state counted up to
        ``most`` + 1 (that many: more than ``most``), all of them within ``budget_ms``
        (a state the time ran out for is left out), and whether every count went to its
        end. Counting each state to its end read every job in it, from the page's own
        event loop (the 800,000 succeeded of 1,000,000 jobs: over 100 ms)."""
        counts: dict[str, int] = {}
        exact = True
        deadline = time.monotonic() + budget_ms / 1000
        for state in JobState:
            left = int((deadline - time.monotonic()) * 1000)
            found = None
            if left > 0:
                found = await self._count({**where, "state": state.value}, most + 1, left)
            if found is None or found > most:
                exact = False
            if found:
                counts[state.value] = found
        return counts, exact

    async def count_states(
        self, where: dict[str, Any], states: Iterable[JobState] = JobState
    ) -> dict[str, int]:
        """How many jobs matching ``where`` are in each of ``states`` (zero states left
        out)."""
        counts = {}
        for state in states:
            n = await self._count_all({**where, "state": state.value})
            if n:
                counts[state.value] = n
        return counts

    async def changed_since(self, after: int, limit: int = 500) -> list[dict[str, Any]]:
        """Summaries of the jobs whose view changed after stream sequence ``after``,
        oldest change first, each with its ``feed_seq``."""
        cursor = (
            self.jobs.find({"feed_seq": {"$gt": after}}, {"spec_json": 0, "original_json": 0})
            .sort([("feed_seq", ASCENDING)])
            .limit(limit)
        )
        return [{**summary(doc), "feed_seq": doc["feed_seq"]} async for doc in cursor]

    async def last_change(self) -> int:
        """The newest ``feed_seq`` (0 with none)."""
        cursor = self.jobs.find({"feed_seq": {"$gt": 0}}, {"feed_seq": 1})
        docs = [doc async for doc in cursor.sort([("feed_seq", DESCENDING)]).limit(1)]
        return int(docs[0]["feed_seq"]) if docs else 0

    async def resources(
        self, dialect: str, user: str | None, key: str | None = None
    ) -> list[dict[str, Any]]:
        """The Kubernetes-style objects of a dialect: its jobs not deleted, whole, oldest
        first (``key``: those of one name). Jobs refused when created are not objects;
        jobs of an earlier version (not claimed at intake) still are, unless rejected."""
        query: dict[str, Any] = {"dialect": dialect, "deleted_at": None, "state": {"$ne": None}}
        if user:
            query["user"] = user
        if key:
            query["dialect_key"] = key
        cursor = self.jobs.find(query).sort([("submitted_at", ASCENDING), ("_id", ASCENDING)])
        # A user's in the user's index, one by name in the names': SQLite took the
        # dialect's, in the list's order, and read each of the dialect's jobs (a user's
        # 882 of 166,000 Kubeflow jobs: 0.7 s; one of them by name as long).
        lead = BY_KEY if key and user and needs_hints(self.jobs) else self._lead(query)
        if lead is not None:
            cursor = cursor.hint(lead)
        return [doc async for doc in cursor if is_resource(doc)]

    async def resource_page(
        self, dialect: str, user: str | None, limit: int, after: tuple[datetime, str] | None
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` of the jobs ``resources`` reads (objects or not: is_resource),
        whole, oldest first, after the (submitted_at, id) ``after``: a page of a
        Kubernetes-style list with a ``limit``, read in the page's order (a list of
        every object read and rendered each of them: an admin's, every job of the
        dialect)."""
        docs, _ = await self.list_jobs(
            user=user, state=None, limit=limit, offset=0,
            where={"dialect": dialect, "deleted_at": None}, full=True, after=after,
            oldest_first=True, count=False,
        )  # fmt: skip
        return docs

    async def resource_changes(
        self, dialect: str, after: int, limit: int = 500
    ) -> list[dict[str, Any]]:
        """A dialect's jobs changed after stream sequence ``after``, whole, oldest change
        first (a Kubernetes-style watch)."""
        query = {"dialect": dialect, "feed_seq": {"$gt": after}}
        cursor = self.jobs.find(query).sort([("feed_seq", ASCENDING)]).limit(limit)
        if needs_hints(self.jobs):
            # The dialect's changes since ``after``, a range of their own index: SQLite
            # took the dialect's index by time and read and sorted each of its jobs at
            # every poll of every watch (166,000 Kubeflow jobs of 1,000,000); the
            # changes' index alone read every other dialect's changes since the watch
            # began, at each poll of a quiet dialect's watch (found in review).
            cursor = cursor.hint(BY_DIALECT_CHANGE)
        return [doc async for doc in cursor]

    async def find_by_key(
        self, user: str, key: str, dialect: str | None = None
    ) -> dict[str, Any] | None:
        """The job a dialect's API names by ``key`` (e.g. OpenPAI's user~jobName): the
        newest one that was not rejected, since a rejected copy may share its name."""
        query: dict[str, Any] = {"user": user, "dialect_key": key, "state": {"$ne": None}}
        if dialect:
            query["dialect"] = dialect
        found = None
        cursor = self.jobs.find(query).sort([("submitted_at", DESCENDING)])
        if needs_hints(self.jobs):
            # SQLite took the dialect's index, in this order, and read each of its jobs
            # (a Kubeflow job by name, 1,000,000 jobs in all: 0.6 s).
            cursor = cursor.hint(BY_KEY)
        async for doc in cursor:
            if doc.get("state") != "REJECTED":
                return doc
            found = found or doc
        return found

    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        return await self.jobs.find_one({"_id": job_id})

    async def job_tasks(
        self,
        job_id: str,
        *,
        limit: int = 0,
        after: tuple[int, str, int] | None = None,
        attempt: int | None = None,
    ) -> list[dict[str, Any]]:
        """The job's tasks by attempt, role and index (``limit`` 0: all of them);
        ``after``: the (attempt, role, index) of the last task of the page before;
        ``attempt``: that attempt's alone."""
        order = [("attempt", ASCENDING), ("role", ASCENDING), ("index", ASCENDING)]
        base: dict[str, Any] = {"job_id": job_id}
        if attempt is not None:
            base["attempt"] = attempt
        if after is None:
            cursor = self.tasks.find(base).sort(order)
            return [task_view(doc) async for doc in (cursor.limit(limit) if limit else cursor)]
        # Keyset: the rest of the last task's role, then of its attempt, then the later
        # attempts; each a walk of the same index from where the page before stopped.
        at, role, index = after
        parts = [
            {"attempt": at, "role": role, "index": {"$gt": index}},
            {"attempt": at, "role": {"$gt": role}},
        ]
        if attempt is None:
            parts.append({"attempt": {"$gt": at}})
        elif attempt != at:
            return []
        tasks: list[dict[str, Any]] = []
        for part in parts:
            if limit and len(tasks) >= limit:
                break
            cursor = self.tasks.find({**base, **part}).sort(order)
            if limit:
                cursor = cursor.limit(limit - len(tasks))
            tasks += [task_view(doc) async for doc in cursor]
        return tasks

    async def events_of(self, job_id: str) -> list[Event]:
        """The job's events as they were published, in stream order."""
        cursor = self.events.find({"job_id": job_id}).sort([("seq", ASCENDING)])
        return [decode(doc["event_json"].encode()) async for doc in cursor]

    async def history(
        self, job_id: str, *, after_seq: int = 0, limit: int = 0
    ) -> list[dict[str, Any]]:
        """The job's history in stream order: the events after stream sequence
        ``after_seq``, at most ``limit`` of them (0: all)."""
        query: dict[str, Any] = {"job_id": job_id}
        if after_seq:
            query["seq"] = {"$gt": after_seq}
        cursor = self.events.find(query).sort([("seq", ASCENDING)])
        if limit:
            cursor = cursor.limit(limit)
        return [
            {
                "seq": doc["seq"],
                "type": doc["type"],
                "event_id": doc["_id"],
                "occurred_at": doc["occurred_at"],
                "trace_id": doc.get("trace_id"),
                "event": hide_secrets(json.loads(doc["event_json"])),
            }
            async for doc in cursor
        ]


def _list_query(
    user: str | None, state: str | None, where: dict[str, Any] | None
) -> dict[str, Any]:
    """A job list's filter: the jobs seen whole (a state set) and ``where``."""
    query: dict[str, Any] = {"state": {"$ne": None}, **(where or {})}
    if user:
        query["user"] = user
    if state:
        query["state"] = state
    if query["state"] == {"$ne": None} and any(
        key.split(".", 1)[0] in SUBMITTED_FIELDS and _needs_field(cond)
        for key, cond in query.items()
    ):
        # A job with any of these has a state (JobSubmitted sets them with its own), so
        # the test, which reads each document, is left out: a count is then a walk of
        # the filter's index alone (a user's 5,000 jobs: 21 ms to count, each one read).
        del query["state"]
    return query


def label_rows(job_id: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """The labels index's documents of a job, from its submitted fields (``labels``,
    ``user``, ``submitted_at``): one per label."""
    return [
        {
            "_id": json.dumps([job_id, key]),
            "job_id": job_id,
            "pair": _pair(key, value),
            "user": fields.get("user"),
            "submitted_at": fields.get("submitted_at"),
        }
        for key, value in sorted((fields.get("labels") or {}).items())
    ]


def _pair(key: str, value: Any) -> str:
    return json.dumps([key, value])


def _label_rows_query(query: dict[str, Any]) -> dict[str, Any] | None:
    """The labels' documents a list of one label reads instead of the jobs, where its
    query holds nothing they do not (one label, a user, a submission time, a cursor);
    None otherwise."""
    labels = [key for key in query if key.startswith("labels.")]
    if len(labels) != 1 or not set(query) <= {labels[0], "user", "submitted_at", "_id"}:
        return None
    value, user = query[labels[0]], query.get("user")
    if not isinstance(value, str) or not isinstance(user, str | None):
        return None
    if "_id" in query and not _is_bound(query["_id"]):
        return None
    rows = {"pair": _pair(labels[0].split(".", 1)[1], value)}
    return {**rows, "user": user} if user is not None else rows


def _single(cond: Any) -> str | None:
    """The one value a condition matches by equality (itself, or an ``$in`` of one)."""
    if isinstance(cond, dict) and set(cond) == {"$in"} and isinstance(cond["$in"], list):
        cond = cond["$in"][0] if len(cond["$in"]) == 1 else None
    return cond if isinstance(cond, str) else None


def _named(query: dict[str, Any]) -> bool:
    """Whether ``query`` searches a name, or a prefix of one, which the name's index
    serves (a part of one, DLC's fuzzy DisplayName, is tested in each document)."""
    name = query.get("name")
    ranged = isinstance(name, dict) and set(name) <= {"$gte", "$gt", "$lt", "$lte"}
    return isinstance(name, str) or ranged


def _copies(query: dict[str, Any]) -> dict[str, Any] | None:
    """``query`` with each COUNTED field and the submission time named by its copy,
    within ``$and`` and ``$or`` too; None where it tests any other field."""
    copied: dict[str, Any] = {}
    for key, cond in query.items():
        if key in ("$and", "$or") and isinstance(cond, list):
            parts = [_copies(part) if isinstance(part, dict) else None for part in cond]
            if any(part is None for part in parts):
                return None
            copied[key] = parts
        elif key in COUNTED or key == "submitted_at":
            copied[copy_key(key)] = cond
        else:
            return None
    return copied


def _days(first: date, last: date, cond: Any) -> list[str]:
    """The days (``day_text``) from ``first`` to ``last`` that a submission time meeting
    ``cond`` (a datetime, bounds, an ``$in``; anything else: every day) can fall on."""
    if isinstance(cond, datetime):
        cond = {"$in": [cond]}
    if isinstance(cond, dict):
        for op, value in cond.items():
            values = value if op == "$in" and isinstance(value, list) else [value]
            if not values or not all(isinstance(v, datetime) for v in values):
                continue
            days = [date.fromisoformat(day_text(v)) for v in values]
            if op in ("$gt", "$gte", "$in"):
                first = max(first, min(days))
            if op in ("$lt", "$lte", "$in"):
                last = min(last, max(days))
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


def _and_bound(cond: Any, op: str, value: Any) -> Any:
    """A condition on a field that holds ``cond`` and ``{op: value}`` both (``op``: a
    bound, ``$lt`` or ``$gt``)."""
    if cond is None:
        return {op: value}
    merged = dict(cond) if isinstance(cond, dict) else {"$in": [cond]}
    known = merged.get(op)
    merged[op] = value if known is None else (min if op == "$lt" else max)(known, value)
    return merged


def _is_bound(cond: Any) -> bool:
    return isinstance(cond, dict) and set(cond) <= {"$gt", "$gte", "$lt", "$lte"}


def _rows_part(rows: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``rows`` with ``part``'s bounds on the submission time and the id (a page's
    cursor), as the labels' documents hold them."""
    bounds = {"submitted_at": part["submitted_at"]} if "submitted_at" in part else {}
    return {**rows, **bounds, **({"job_id": part["_id"]} if "_id" in part else {})}


def _needs_field(cond: Any) -> bool:
    """Whether a filter's condition can match only a document holding its field (a
    ``$ne``, a ``$nin`` or a None matches one without it too)."""
    if isinstance(cond, dict):
        ops = set(cond) - {"$options"}
        if not ops or not ops <= {"$in", "$gt", "$gte", "$lt", "$lte", "$regex"}:
            return False
        return all(None not in cond[op] if op == "$in" else cond[op] is not None for op in ops)
    return cond is not None and not isinstance(cond, list)


def is_resource(doc: dict[str, Any]) -> bool:
    """A job of a Kubernetes-style dialect that is an object of its API: it claimed its
    name at submission (one refused then never was an object); a job of an earlier
    version, which claimed nothing, unless it was rejected."""
    claimed = doc.get("claimed")
    return bool(claimed) if claimed is not None else doc.get("state") != "REJECTED"


def hide_secrets(event: dict[str, Any]) -> dict[str, Any]:
    """An event as history may show it: the spec's secret values and what the original
    payload's dialect calls secret are hidden (OpenPAI v2 ``secrets``)."""
    spec = event.get("spec")
    if isinstance(spec, dict) and spec.get("secrets"):
        event["spec"] = {**spec, "secrets": [{**s, "value": REDACTED} for s in spec["secrets"]]}
    chosen = BY_NAME.get(event.get("dialect") or "")
    if event.get("original") is not None and chosen is not None:
        event["original"] = chosen.redact(event["original"])
    return event


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": doc["_id"],
        "name": doc.get("name"),
        "user": doc.get("user"),
        "state": doc.get("state"),
        "dialect": doc.get("dialect"),
        "queue": doc.get("queue"),
        "kind": doc.get("kind"),
        "labels": doc.get("labels"),
        "submitted_at": doc.get("submitted_at"),
        "updated_at": doc.get("updated_at"),
        "reason": doc.get("reason"),
    }


def job_view(doc: dict[str, Any], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    spec = doc.get("spec_json")
    attempt = doc.get("attempt", 1)
    attempts = sorted(doc.get("attempts", []), key=lambda a: a.get("attempt", 0))
    return {
        **summary(doc),
        "queue": doc.get("queue"),
        "priority": doc.get("priority"),
        "tags": doc.get("tags") or [],
        # Retries are failed attempts run again; an interrupted one (paused, preempted,
        # scaled) is not one.
        "attempt": attempt,
        "retries": sum(1 for a in attempts if a.get("retried_as") and not a.get("interrupted")),
        # How each attempt ended, oldest first (a retried one says when it ran again).
        "attempts": attempts,
        "failure_class": doc.get("failure_class"),
        "finished_at": doc.get("finished_at"),
        "exit_code": doc.get("exit_code"),
        "errors": doc.get("errors", []),
        "warnings": doc.get("warnings", []),
        "queue_reasons": doc.get("queue_reasons", []),
        "queue_position": doc.get("queue_position"),
        "spec": json.loads(spec) if spec else None,
        # As the user sent it, in its dialect's shape (secrets hidden); None for native.
        "original": json.loads(doc["original_json"]) if doc.get("original_json") else None,
        "tasks": tasks,
    }


def task_view(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": doc.get("role"),
        "index": doc.get("index"),
        "attempt": doc.get("attempt"),
        "state": doc.get("state"),
        "exit_code": doc.get("exit_code"),
        "reason": doc.get("reason"),
        "failure_class": doc.get("failure_class"),
        "node": doc.get("node"),
        "host_ip": doc.get("host_ip"),
        "gpu_indices": doc.get("gpu_indices", []),
        "ports": doc.get("ports", []),
        "started_at": doc.get("started_at"),
        "ended_at": doc.get("ended_at"),
        "updated_at": doc.get("updated_at"),
    }


COLLECTIONS = ("jobs", "tasks", "events", "labels")


# What a repair of each view's document is conditional on: the fields every write of
# the projection to it changes, as the comparison read them.
GUARDS = {
    "jobs": ("feed_seq", "state_rank"),
    "tasks": ("seq", "state", "node"),
    "events": ("seq",),
    "labels": ("pair",),  # written once
}


async def compare_views(
    live: JobViews, rebuilt: JobViews, until: int, apply: bool
) -> list[dict[str, Any]]:
    """Where the live views differ from the rebuilt ones, document by document (both
    walked in id order); with ``apply`` each difference is written over the live one.

    What changed after stream sequence ``until`` is newer than the rebuild and left as
    it is: history after it; a job whose ``feed_seq`` is past it, as read or as the
    views say once the walk is over (a task read after the jobs were may hold a change
    whose job was read before it), and that job's tasks; a task at a later transition
    than the rebuilt one. Each repair is conditional on the live document being as the
    walk read it (``GUARDS``): one changed since is left as it is (and said so), and a
    document missing live is only inserted, never written over one made meanwhile."""
    # (view, id, its job, difference, guard): the rebuilt copy is read again to repair.
    found: list[tuple[str, Any, Any, str, dict[str, Any] | None]] = []
    newer: set[Any] = set()
    for name in COLLECTIONS:
        ours, theirs = getattr(live, name), getattr(rebuilt, name)
        left = aiter(ours.find({}).sort([("_id", ASCENDING)]))
        right = aiter(theirs.find({}).sort([("_id", ASCENDING)]))
        a, b = await _next(left), await _next(right)
        while a is not None or b is not None:
            if name == "jobs" and a is not None and _newer(name, a, until):
                newer.add(a["_id"])
            read: dict[str, Any] | None
            if b is None or (a is not None and a["_id"] < b["_id"]):
                doc, kind, read, a = a, "only live", a, await _next(left)
            elif a is None or b["_id"] < a["_id"]:
                doc, kind, read, b = b, "missing", None, await _next(right)
            else:
                same = a == b
                if name == "tasks" and (a.get("seq") or 0) > (b.get("seq") or 0):
                    same = True  # at a later transition than the rebuild saw: newer
                doc, kind, read = a, "differs", a
                a, b = await _next(left), await _next(right)
                if same:
                    continue
            assert doc is not None
            if _newer(name, doc, until):
                continue
            guard = None if read is None else {field: read.get(field) for field in GUARDS[name]}
            job = doc["_id"] if name == "jobs" else doc.get("job_id")
            found.append((name, doc["_id"], job, kind, guard))
    # The walk over: a task's change is on its job's feed_seq by now.
    newer |= {doc["_id"] async for doc in live.jobs.find({"feed_seq": {"$gt": until}}, {"_id": 1})}
    differences: list[dict[str, Any]] = []
    for name, doc_id, job, kind, guard in found:
        if name != "events" and job in newer:
            continue
        difference = {"collection": name, "id": doc_id, "difference": kind}
        differences.append(difference)
        if apply and not await _repair(live, rebuilt, name, doc_id, guard):
            difference["left"] = "changed while compared"
    return differences


async def _repair(
    live: JobViews, rebuilt: JobViews, name: str, doc_id: Any, guard: dict[str, Any] | None
) -> bool:
    """The live document ``doc_id`` made the rebuilt one (or removed), only while it is
    as it was read (``guard``; None: it was not there); False when it was not."""
    ours = getattr(live, name)
    fix = await getattr(rebuilt, name).find_one({"_id": doc_id})
    if guard is None:
        return fix is None or await insert_once(ours, fix)
    if fix is None:
        return bool((await ours.delete_one({"_id": doc_id, **guard})).deleted_count)
    return bool((await ours.replace_one({"_id": doc_id, **guard}, fix)).matched_count)


def _newer(name: str, doc: dict[str, Any], until: int) -> bool:
    if name == "jobs":
        return (doc.get("feed_seq") or 0) > until
    return name == "events" and (doc.get("seq") or 0) > until


async def _next(walk: Any) -> dict[str, Any] | None:
    try:
        return dict(await anext(walk))
    except StopAsyncIteration:
        return None
