"""The embedded store answers like MongoDB: the same operations on SQLite and on the
MongoDB wire (FerretDB, or MongoDB under MONGO_URL) give the same documents and counts;
what it does not implement it refuses; what the services query uses a real index."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from trainyard_common.docstore import (
    SqliteClient,
    SqliteCollection,
    TimedOut,
    Unsupported,
    copy_key,
    day_key,
    day_text,
)
from trainyard_common.storage import Client, count_within, insert_once
from trainyard_status.adapters.views import JobViews

from ..support.stores import store_client

T0 = datetime(2026, 11, 25, 12, 0, 0, 123000, tzinfo=UTC)

QUERIES: list[dict[str, Any]] = [
    {},
    {"state": "RUNNING"},
    {"state": None},
    {"state": {"$ne": None}},
    {"state": {"$ne": "RUNNING"}},
    {"state": {"$in": ["RUNNING", "FAILED"]}},
    {"state": {"$in": ["RUNNING", None]}},
    {"state": {"$nin": ["RUNNING", "FAILED"]}},
    {"state": {"$nin": ["RUNNING", None]}},
    {"rank": {"$lt": 3}},
    {"rank": {"$lte": 3}, "user": "alice"},
    {"rank": {"$gt": 1, "$lte": 4}},
    {"at": {"$gte": T0 + timedelta(minutes=5)}},
    {"flag": True},
    {"flag": False},
    {"meta.zone": "b"},
    {"_id": "j07", "rank": {"$lt": 9}},
    {"_id": {"$in": ["j01", "j02", "nope"]}},
    # An array field: its elements are what $in and $nin test.
    {"meta.tags": {"$in": ["y", "z"]}},
    {"meta.tags": {"$nin": ["y"]}},
    {"meta.tags": {"$in": ["x"]}, "user": {"$nin": ["bob"]}},
    # Substring searches (an escaped literal), and a top-level $or.
    {"user": {"$regex": "AR", "$options": "i"}},
    {"user": {"$regex": "AR"}},
    {"text": {"$regex": re.escape("plain 1")}},
    {"text": {"$regex": re.escape("like a (mark)"[:6])}},
    {"$or": [{"user": "bob"}, {"meta.zone": "a"}], "flag": True},
    {"$or": [{"user": {"$regex": "o", "$options": "i"}}, {"rank": {"$gt": 4}}]},
    # $and: two $or in one query.
    {"$and": [{"$or": [{"user": "bob"}, {"rank": 1}]}, {"$or": [{"flag": True}, {"state": None}]}]},
]


def documents(n: int = 24) -> list[dict[str, Any]]:
    rng = random.Random(7)
    docs = []
    for i in range(n):
        doc: dict[str, Any] = {
            "_id": f"j{i:02d}",
            "user": rng.choice(["alice", "bob", "carol"]),
            "rank": rng.randint(0, 5),
            "at": T0 + timedelta(minutes=rng.randint(0, 10), milliseconds=i),
            "flag": rng.random() < 0.5,
            "meta": {"zone": rng.choice("abc"), "tags": ["x", "y"][: rng.randint(0, 2)]},
            "text": "\ue000looks like a mark" if i == 3 else f"plain {i}",
            "dotted_names_in_json": '{"nvidia.com/gpu": 1}',
        }
        if rng.random() < 0.8:
            doc["state"] = rng.choice(["RUNNING", "FAILED", "SUCCEEDED", None])
        docs.append(doc)
    return docs


async def run_script(client: Client, db: str) -> list[Any]:
    """Every operation the adapters use, with what each answered."""
    col = client[db]["items"]
    await col.create_index([("user", 1), ("at", -1)])
    await col.create_index([("state", 1)])
    out: list[Any] = []
    for doc in documents():
        out.append(await insert_once(col, doc))
    out.append(await insert_once(col, {"_id": "j01", "user": "mallory"}))
    for query in QUERIES:
        found = [d async for d in col.find(query).sort([("at", 1), ("_id", 1)])]
        out.append((query, await col.count_documents(query), found))
        # A count that stops at a bound, within a time (the list totals' count_within).
        out.append(await count_within(col, query, 4, 10_000))
    # Read through a named index (hint) and within a time: the same documents, whether
    # the index holds every field the query tests (the embedded store then sorts the
    # ids in it before reading the page's documents) or not.
    for query in (
        {"user": "bob"},
        {"user": {"$in": ["bob", "carol"]}, "at": {"$gte": T0 + timedelta(minutes=2)}},
        {"user": "alice", "rank": {"$lt": 3}},
    ):
        cursor = col.find(query).sort([("at", -1), ("_id", -1)]).skip(1).limit(3)
        cursor = cursor.hint([("user", 1), ("at", -1)]).max_time_ms(10_000)
        out.append([d async for d in cursor])
        # Counted in that index, all of them or up to a bound.
        out.append(await col.count_documents(query, hint=[("user", 1), ("at", -1)]))
        out.append(await count_within(col, query, 2, 10_000, hint=[("user", 1), ("at", -1)]))
    out.append([d async for d in col.find({}, {"rank": 1}).sort("_id", -1).skip(3).limit(5)])
    out.append([d async for d in col.find({"user": "bob"}, {"meta": 0, "text": 0}).sort("_id")])
    out.append(await col.find_one({"_id": "j03"}))
    out.append(await col.find_one({"_id": "missing"}))

    def counts(result: Any) -> tuple[int, int]:
        return (result.matched_count, result.modified_count)

    out.append(counts(await col.update_one({"_id": "j04"}, {"$set": {"state": "X", "n.m": 2}})))
    out.append(counts(await col.update_one({"_id": "j04"}, {"$set": {"state": "X"}})))
    out.append(
        counts(await col.update_one({"_id": "j04", "rank": {"$lt": -1}}, {"$set": {"a": 1}}))
    )
    out.append(counts(await col.update_one({"_id": "j05"}, {"$push": {"log": {"at": T0}}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$push": {"log": {"at": T0}}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$addToSet": {"set": {"k": 1}}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$addToSet": {"set": {"k": 1}}})))
    out.append(
        counts(await col.update_one({"_id": "j05"}, {"$inc": {"rank": 2}, "$unset": {"flag": ""}}))
    )
    out.append(counts(await col.update_one({"_id": "j05"}, {"$addToSet": {"tags": "a"}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$addToSet": {"tags": "b"}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$pull": {"tags": "a"}})))
    out.append(counts(await col.update_one({"_id": "j05"}, {"$pull": {"tags": "a"}})))
    out.append(counts(await col.update_one({"_id": "j04"}, {"$pull": {"tags": "a"}})))
    out.append(counts(await col.update_many({"user": "carol"}, {"$set": {"seen": True}})))
    out.append(counts(await col.replace_one({"_id": "j06"}, {"only": "this"})))
    out.append(counts(await col.replace_one({"_id": "new"}, {"_id": "new", "v": 1}, upsert=True)))
    out.append((await col.delete_one({"_id": "j07"})).deleted_count)
    out.append((await col.delete_one({"_id": "j07"})).deleted_count)
    out.append([d async for d in col.find({}).sort("_id")])
    return out


async def test_sqlite_answers_as_mongodb_does(
    request: pytest.FixtureRequest, db_prefix: str
) -> None:
    async with store_client(request, "mongo", db_prefix) as mongo:
        expected = await run_script(mongo, f"{db_prefix}_x")
    async with store_client(request, "sqlite", db_prefix) as sqlite:
        got = await run_script(sqlite, f"{db_prefix}_x")
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        assert ours == theirs


async def test_datetimes_and_marked_strings_round_trip(tmp_path: Path) -> None:
    col = SqliteClient(tmp_path)["db"]["c"]
    naive = datetime(2026, 1, 2, 3, 4, 5)
    doc = {"_id": "a", "t": T0, "n": naive, "s": "\ue001x", "l": [T0, {"t": T0}]}
    await col.insert_one(doc)
    back = await col.find_one({"_id": "a"})
    assert back == {**doc, "n": naive.replace(tzinfo=UTC)}
    # Time order is kept in comparisons, whatever the zone the value was written in.
    later = (T0 + timedelta(hours=1)).astimezone(UTC)
    assert await col.count_documents({"t": {"$lt": later}}) == 1


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("find_one", ({"$nor": [{"a": 1}]},)),
        ("find_one", ({"$and": [None]},)),  # matched every document: MongoDB refuses it
        ("find_one", ({"$or": [{"a": 1}, "a"]},)),
        ("find_one", ({"a": {"$regex": "x.*"}},)),
        ("find_one", ({"a": {"$regex": "x", "$options": "m"}},)),
        ("find_one", ({"a": {"$lt": None}},)),
        ("find_one", ({"a": {"b": 1}},)),
        ("update_one", ({"_id": "a"}, {"a": 1})),
        ("update_one", ({"_id": "a"}, {"$rename": {"a": "b"}})),
        ("update_one", ({"_id": "a"}, {"$push": {"l": {"$each": [1]}}})),
        ("replace_one", ({"_id": "a"}, {"$set": {"a": 1}})),
        ("insert_one", ({"_id": 5},)),
    ],
)
async def test_what_is_not_implemented_is_refused(
    tmp_path: Path, call: str, args: tuple[Any, ...]
) -> None:
    col = SqliteClient(tmp_path)["db"]["c"]
    await col.insert_one({"_id": "a", "a": 1, "l": []})
    with pytest.raises(Unsupported):
        await getattr(col, call)(*args)


def plan(col: SqliteCollection, sql_where: str, params: list[Any], order: str = "") -> str:
    rows = col.database.conn.execute(
        f'EXPLAIN QUERY PLAN SELECT id, doc FROM "{col.name}" WHERE {sql_where} {order}', params
    ).fetchall()
    return " | ".join(str(r[-1]) for r in rows)


async def test_the_status_views_queries_use_real_indexes(tmp_path: Path) -> None:
    views = JobViews(SqliteClient(tmp_path)["trainyard_status"])  # type: ignore[arg-type]
    await views.ensure_indexes()
    jobs: SqliteCollection = views.jobs  # type: ignore[assignment]
    for query, sort in [
        ({"_id": "j1"}, []),
        ({"_id": "j1", "state_rank": {"$lt": 3}}, []),
        ({"state": {"$ne": None}, "user": "alice"}, [("submitted_at", -1), ("_id", -1)]),
        ({"state": "RUNNING"}, [("submitted_at", -1), ("_id", -1)]),
        ({"state": {"$ne": None}}, [("submitted_at", -1), ("_id", -1)]),
    ]:
        where, params = jobs._where(query)
        order = (
            "ORDER BY "
            + ", ".join(f"{jobs._expr(f)} {'DESC' if d < 0 else 'ASC'}" for f, d in sort)
            if sort
            else ""
        )
        found = plan(jobs, where, params, order)
        # A search in an index, or a walk of one in the order asked (a page stops early);
        # never a walk of the table, never a sort.
        assert "USING" in found and "TEMP B-TREE" not in found, (query, found)
    # Each filter by equality of a list page (/v1/jobs's queue, dialect, kind, user and
    # state; the dialects' lists by queue or dialect) is a search of an index that field
    # leads, read in the page's order either way: a walk of the newest-first index
    # testing every job (a page of a rare queue read all of them) is not enough.
    for field in ("queue", "dialect", "kind", "user", "state"):
        query = {"state": {"$ne": None}, field: "x"} if field != "state" else {"state": "x"}
        where, params = jobs._where(query)
        for way in ("DESC", "ASC"):
            order = f"ORDER BY {jobs._expr('submitted_at')} {way}, id {way}"
            found = plan(jobs, where, params, order)
            assert found.startswith("SEARCH jobs USING INDEX ix_jobs_" + field), (field, found)
            assert f"({jobs._expr(field)}=?)" in found and "TEMP B-TREE" not in found, found
        # ... and a time window on top narrows the same search.
        window = {**query, "submitted_at": {"$gte": datetime(2026, 1, 1, tzinfo=UTC)}}
        where, params = jobs._where(window)
        found = plan(jobs, where, params, f"ORDER BY {jobs._expr('submitted_at')} DESC, id DESC")
        assert f"({jobs._expr(field)}=? AND {jobs._expr('submitted_at')}>?)" in found, found
    # A page of a job's tasks (up to 100,000) and of its history: a walk of an index in
    # the page's order from where the page before ended, never a sort of all of them.
    tasks: SqliteCollection = views.tasks  # type: ignore[assignment]
    by_task = "ORDER BY f_attempt ASC, f_role ASC, f_index ASC"
    for query in [
        {"job_id": "j1"},
        {"job_id": "j1", "attempt": 2},
        {"job_id": "j1", "attempt": 1, "role": "w", "index": {"$gt": 3}},
        {"job_id": "j1", "attempt": 1, "role": {"$gt": "w"}},
        {"job_id": "j1", "attempt": {"$gt": 1}},
    ]:
        where, params = tasks._where(query)
        found = plan(tasks, where, params, by_task)
        assert found.startswith("SEARCH tasks USING INDEX"), (query, found)
        assert "TEMP B-TREE" not in found, (query, found)
    events: SqliteCollection = views.events  # type: ignore[assignment]
    where, params = events._where({"job_id": "j1", "seq": {"$gt": 10}})
    found = plan(events, where, params, "ORDER BY f_seq ASC")
    assert "(f_job_id=? AND f_seq>?)" in found and "TEMP B-TREE" not in found, found


async def test_a_name_prefix_page_is_read_the_way_its_matches_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's planner cannot know how many jobs a name prefix holds: walking the page's
    order and testing each job read all of them for a rare prefix (1,000,000 jobs: 4-8
    s), and reading every match through the name's index, with its document, took 1.3 s
    for a common one (sorting their ids alone: 30 ms for 111,111). The list reads a few
    through the name's index, walks for many, and when the walk runs past its time,
    reads the matches a day at a time, newest first, sorting one day's alone."""
    import trainyard_status.adapters.views as views_module

    monkeypatch.setattr(views_module, "NAME_SORTED_MOST", 50)
    monkeypatch.setattr(views_module, "NAME_WALK_MS", 1)
    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    # Oldest first, one every 20 minutes (305 days): 2,000 "old-", 20 "rare-", then
    # 20,000 "new-".
    names = [f"old-{i}" for i in range(2000)] + [f"rare-{i}" for i in range(20)]
    names += [f"new-{i}" for i in range(20_000)]
    with database.transaction():
        for i, name in enumerate(names):
            database["jobs"]._insert(
                {
                    "_id": f"j{i:06d}", "name": name, "user": "u",
                    "state": "FAILED" if i % 4 == 0 else "SUCCEEDED",
                    "submitted_at": T0 + timedelta(minutes=20 * i), "pad": "x" * 300,
                }
            )  # fmt: skip
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)

    async def page(prefix: str, **kw: Any) -> tuple[list[str], list[str]]:
        statements.clear()
        where = {"name": {"$gte": prefix, "$lt": prefix + "\U0010ffff"}}
        items, _ = await views.list_jobs(
            limit=5, offset=0, where=where, count=False, **{"user": None, "state": None, **kw}
        )
        return [i["name"] for i in items], page_reads()

    def page_reads() -> list[str]:
        """The reads of the page's jobs (not those of the first and last day)."""
        return [s for s in statements if s.startswith("SELECT id, doc") and "f_name" in s]

    def plans(reads: list[str]) -> list[str]:
        return [
            " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
            for sql in reads
        ]

    def days_searched(sql: str) -> list[str]:
        """The days a read's IN list names (the trace gives its parameters in place)."""
        [days] = re.findall(r"d_submitted_at IN \(([^)]*)\)", sql)
        return days.split(", ")

    names_found, reads = await page("rare-")
    assert names_found == [f"rare-{i}" for i in (19, 18, 17, 16, 15)]
    [found] = plans(reads)
    assert "ix_jobs_name_1" in found and "f_name>? AND f_name<?" in found, found
    names_found, reads = await page("new-")
    assert names_found == [f"new-{i}" for i in range(19_999, 19_994, -1)]
    [found] = plans(reads)  # the walk found its page at once
    assert "SCAN jobs USING INDEX ix_jobs_submitted_at" in found, found
    assert "ix_jobs_name_1" not in found, found
    # Many old ones under 20,000 newer: the walk gives up, and the matches are searched
    # day by day in the index the submission's day leads, each day's sorted alone.
    names_found, reads = await page("old-")
    assert names_found == [f"old-{i}" for i in range(1999, 1994, -1)]
    walk, by_day = plans(reads)
    assert "SCAN jobs USING INDEX ix_jobs_submitted_at" in walk, walk
    assert "SEARCH jobs USING INDEX ix_jobs_submitted_at:day_m1_name_1" in by_day, by_day
    assert "(d_submitted_at=? AND f_name>? AND f_name<?)" in by_day, by_day
    assert "TEMP B-TREE FOR RIGHT PART OF ORDER BY" in by_day, by_day
    oldest, _ = await page("old-", oldest_first=True)
    assert oldest == [f"old-{i}" for i in range(5)]
    # Every day from the first job's to the last's, or to today's where that is later:
    # a replica sharing the file may store a job of a new day before the page is read.
    last_day = (T0 + timedelta(minutes=20 * (len(names) - 1))).date()
    last_day = max(last_day, datetime.now(UTC).date())
    assert len(days_searched(reads[-1])) == (last_day - T0.date()).days + 1
    # The days a page cannot hold are not searched: those after a cursor's, or outside
    # a window of time (here among "new-" jobs: the walk gives up at once).
    monkeypatch.setattr(views_module, "NAME_WALK_MS", 0)
    old = {"name": {"$gte": "old-", "$lt": "old-\U0010ffff"}}
    cursor_at = T0 + timedelta(minutes=20 * 12_000)
    window = {"$gte": T0 + timedelta(days=1), "$lt": T0 + timedelta(days=200)}
    for where, after, days in [
        (old, (cursor_at, "j012000"), (cursor_at.date() - T0.date()).days),
        ({**old, "submitted_at": window}, None, 199),
    ]:
        statements.clear()
        items, _ = await views.list_jobs(
            user=None, state=None, limit=3, offset=0, where=where, after=after, count=False
        )
        assert [i["name"] for i in items] == ["old-1999", "old-1998", "old-1997"]
        *_, last = page_reads()
        assert len(days_searched(last)) == days + 1, last
    # Jobs by id besides (DLC's JobId): a lookup by id, as the store's planner chooses.
    statements.clear()
    where = {"name": {"$gte": "new-", "$lt": "new-\U0010ffff"}, "_id": {"$in": ["j002100"]}}
    items, _ = await views.list_jobs(user=None, state=None, limit=5, offset=0, where=where)
    assert [i["name"] for i in items] == ["new-80"]
    [found] = plans(page_reads())
    assert "sqlite_autoindex_jobs_1 (id=?)" in found, found
    # One user's (every list but an admin's): the same ways, in the index the user leads.
    names_found, reads = await page("rare-", user="u")
    assert names_found == [f"rare-{i}" for i in (19, 18, 17, 16, 15)]
    [found] = plans(reads)
    assert "ix_jobs_user_1_name_1" in found and "f_user=? AND f_name>? AND f_name<?" in found
    names_found, reads = await page("old-", user="u")
    assert names_found == [f"old-{i}" for i in range(1999, 1994, -1)]
    walk, by_day = plans(reads)
    assert "SEARCH jobs USING INDEX ix_jobs_user_1_submitted_at" in walk, walk
    assert "ix_jobs_user_1_submitted_at:day_m1_name_1" in by_day, by_day
    assert "(f_user=? AND d_submitted_at=? AND f_name>? AND f_name<?)" in by_day, by_day
    # ... and with another filter (the console's state): a walk of the index holding
    # it, and when that gives up, the state tested in the documents of the name's
    # matches, day by day (walking the state's index read each newer job in it).
    want = [f"old-{i}" for i in (1999, 1998, 1997, 1995, 1994)]  # every 4th FAILED
    for user, walked in [("u", "(f_user=? AND f_state=?)"), (None, "(f_state=?)")]:
        names_found, reads = await page("old-", user=user, state="SUCCEEDED")
        assert names_found == want
        walk, by_day = plans(reads)
        assert f"ix_jobs_{'user_1_' if user else ''}state_1" in walk and walked in walk, walk
        day_index = f"ix_jobs_{'user_1_' if user else ''}submitted_at:day_m1_name_1"
        assert day_index in by_day, by_day


async def test_a_datetimes_day_is_a_key_of_its_own_in_utc(tmp_path: Path) -> None:
    """``day_key``: the UTC day of a datetime field as a column an index can lead (the
    status list reads a name prefix's matches day by day through one), and as a filter
    and sort key without one; a document without the field has no day."""
    database = SqliteClient(tmp_path)["db"]
    day = day_key("at")
    by_day = [(day, -1), ("name", 1), ("at", -1)]
    east = timezone(timedelta(hours=8))
    docs = [
        {"_id": "a", "name": "x1", "at": datetime(2026, 11, 29, 7, 59, tzinfo=east)},
        {"_id": "b", "name": "x2", "at": datetime(2026, 11, 29, 8, 0, tzinfo=east)},
        {"_id": "c", "name": "y1", "at": datetime(2026, 11, 29, 12, 0)},  # naive: UTC
        {"_id": "d", "name": "x3", "at": datetime(2026, 11, 30, 0, 0, tzinfo=UTC)},
        {"_id": "e", "name": "x4"},
    ]
    assert [day_text(d["at"]) for d in docs[:4]] == [
        "2026-11-28", "2026-11-29", "2026-11-29", "2026-11-30"
    ]  # fmt: skip
    for indexed in (True, False):
        items = database["indexed" if indexed else "plain"]
        if indexed:
            await items.create_index(by_day)
        for doc in docs:
            await items.insert_one(doc)
        within = {"$in": ["2026-11-29", "2026-11-30"]}
        found = items.find({day: within, "name": {"$gte": "x", "$lt": "y"}})
        found = found.sort([(day, 1), ("at", 1), ("_id", 1)])
        if indexed:
            found = found.hint(by_day)
        assert [d["_id"] async for d in found] == ["b", "d"], indexed
        assert [d["_id"] async for d in items.find({day: None})] == ["e"], indexed
        assert await items.count_documents({day: {"$lt": "2026-11-29"}}) == 1, indexed


async def test_the_days_a_page_may_hold_run_to_today(tmp_path: Path) -> None:
    """The days a name prefix's page searches run from the first job's (in UTC) to the
    last one's, or to today where that is later: a replica sharing the file may store
    a job of a new day between the two reads (found in review)."""
    views = JobViews(SqliteClient(tmp_path)["trainyard_status"])  # type: ignore[arg-type]
    await views.ensure_indexes()
    assert await views._span() is None
    west = timezone(timedelta(hours=-5))
    at = datetime(2020, 1, 1, 23, 59, tzinfo=west)  # the 2nd in UTC
    await views.jobs.insert_one({"_id": "j", "name": "n", "state": "QUEUED", "submitted_at": at})
    first, last = await views._span()  # type: ignore[misc]
    assert (first.isoformat(), last) == ("2020-01-02", datetime.now(UTC).date())


async def test_a_copy_of_a_field_answers_as_the_field(tmp_path: Path) -> None:
    """``copy_key``: the same value under a key of its own (an index over copies serves
    only the queries that name them), indexed or not."""
    database = SqliteClient(tmp_path)["db"]
    docs = [{"_id": f"d{i}", "n": i % 3, "s": ["a", None, "b"][i % 3]} for i in range(9)]
    docs.append({"_id": "e"})
    docs.append({"_id": "f", "t:copy": "a", "labels": {"team:copy": "a", "at:day": "a"}})
    for indexed in (True, False):
        items = database["indexed" if indexed else "plain"]
        if indexed:
            await items.create_index([(copy_key("s"), 1), (copy_key("n"), 1)])
        for doc in docs:
            await items.insert_one(doc)
        for query in [
            {"s": "a"}, {"s": None}, {"s": {"$in": ["a", None]}}, {"s": {"$ne": "b"}},
            {"n": {"$gte": 1}, "s": {"$nin": ["b"]}}, {"$or": [{"s": "b"}, {"n": 0}]},
        ]:  # fmt: skip
            copied = {copy_key(k) if k in "sn" else k: v for k, v in query.items()}
            if "$or" in query:
                copied = {"$or": [{copy_key(k): v for k, v in q.items()} for q in query["$or"]]}
            want = [d["_id"] async for d in items.find(query).sort("_id")]
            assert [d["_id"] async for d in items.find(copied).sort("_id")] == want, query
            assert await items.count_documents(copied) == len(want), query
        # A key that only ends the same (a client's DLC tag "team:copy") is the field
        # of that name, no copy (found in review).
        for key in ("t:copy", "labels.team:copy", "labels.at:day"):
            assert [d["_id"] async for d in items.find({key: "a"})] == ["f"], key


async def test_a_label_page_reads_the_labels_own_index_then_its_jobs_by_id(
    tmp_path: Path,
) -> None:
    """No index of the jobs holds their labels: a page of a rare label walked every job
    (1,000,000 jobs: 2.7 s). Each label is a document of its own too: a page of one
    label is a walk of their index in the page's order, then its jobs by id; with
    another filter, a rare label's few jobs are read by id and a common one walked."""
    from trainyard_status.adapters.views import label_rows

    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    with database.transaction():
        for i in range(3000):
            doc = {
                "_id": f"j{i:05d}", "user": "u", "state": "SUCCEEDED",
                "submitted_at": T0 + timedelta(seconds=i),
                "labels": {"team": "all", **({"run": "rare"} if i % 1000 == 7 else {})},
            }  # fmt: skip
            database["jobs"]._insert(doc)
            for row in label_rows(doc["_id"], doc):
                database["labels"]._insert(row)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)

    def plan(sql: str) -> str:
        return " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))

    async def page(state: str | None = None, **labels: str) -> tuple[list[str], str, str]:
        statements.clear()
        where = {f"labels.{key}": value for key, value in labels.items()}
        items, _ = await views.list_jobs(user=None, state=state, limit=5, offset=0, where=where)
        [jobs] = [s for s in statements if s.startswith('SELECT id, doc FROM "jobs"')]
        rows = [s for s in statements if s.startswith('SELECT id, doc FROM "labels"')]
        return [i["id"] for i in items], plan(jobs), plan(rows[0]) if rows else ""

    for labels, want in [
        ({"run": "rare"}, ["j02007", "j01007", "j00007"]),
        ({"team": "all"}, [f"j{i:05d}" for i in range(2999, 2994, -1)]),
    ]:
        ids, jobs, rows = await page(**labels)
        assert ids == want
        assert "sqlite_autoindex_jobs_1 (id=?)" in jobs, jobs
        assert "SEARCH labels USING INDEX ix_labels_pair_1_submitted_at" in rows, rows
        assert "TEMP B-TREE" not in rows, rows
    ids, jobs, _ = await page(state="SUCCEEDED", run="rare")
    assert ids == ["j02007", "j01007", "j00007"]
    assert "sqlite_autoindex_jobs_1 (id=?)" in jobs, jobs
    # Two labels: the rare one gives the ids, whichever comes first (the common first
    # walked every job).
    for labels in ({"team": "all", "run": "rare"}, {"run": "rare", "team": "all"}):
        ids, jobs, _ = await page(**labels)
        assert ids == ["j02007", "j01007", "j00007"]
        assert "sqlite_autoindex_jobs_1 (id=?)" in jobs, (labels, jobs)
    # Its next page too: the cursor's bound on the id beside the ids (it replaced
    # them: a walk of every id below the cursor's, each job read).
    statements.clear()
    after = (T0 + timedelta(seconds=2007), "j02007")
    where = {"labels.run": "rare"}
    items, _ = await views.list_jobs(
        user=None, state="SUCCEEDED", limit=1, offset=0, where=where, after=after
    )
    assert [i["id"] for i in items] == ["j01007"]
    read = next(s for s in statements if s.startswith('SELECT id, doc FROM "jobs"'))
    found = plan(read)
    assert "sqlite_autoindex_jobs_1 (id=?)" in found and "(id<?)" not in found, found
    ids, jobs, _ = await page(state="SUCCEEDED", team="all")  # 3,000: walked
    assert ids == [f"j{i:05d}" for i in range(2999, 2994, -1)]
    assert "ix_jobs_state_1" in jobs, jobs


async def test_a_users_list_and_its_counts_read_indexes_alone(tmp_path: Path) -> None:
    """Every list but an admin's is one user's: its total and its counts by state (the
    console's) are walks of an index, never of the jobs' documents (a user of 5,000 of
    1,000,000 jobs: 21 ms for the total, 194 for the counts, each job read)."""
    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    for i in range(40):
        await views.jobs.insert_one(
            {
                "_id": f"j{i:03d}", "user": "uv"[i % 2], "state": ["RUNNING", "FAILED"][i % 3 % 2],
                "name": f"n{i}", "submitted_at": T0 + timedelta(seconds=i),
            }
        )  # fmt: skip
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)
    items, total = await views.list_jobs(user="u", state=None, limit=5, offset=0)
    assert total == 20 and [i["id"] for i in items] == ["j038", "j036", "j034", "j032", "j030"]
    assert await views.count_jobs(user="u", state="FAILED") == 6  # j004, j010, ... j034
    assert await views.count_states({"user": "u"}) == {"RUNNING": 14, "FAILED": 6}
    running, _ = await views.list_jobs(user="u", state="RUNNING", limit=3, offset=0)
    assert [i["id"] for i in running] == ["j038", "j036", "j032"]
    counts = [s for s in statements if "count(" in s]
    assert len(counts) > 4, counts  # the lists', count_jobs's, each state's
    for sql in counts:
        # Each column the count tests is one the index search uses: none is tested on
        # each job's document (the state's "IS NOT NULL" was).
        found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
        search = found[found.index("SEARCH") :]
        assert search.startswith("SEARCH jobs USING INDEX ix_jobs_user_1"), (sql, found)
        used = search[search.index("(") :]
        for column in set(re.findall(r"\bf_\w+", sql)):
            assert f"{column}=?" in used, (sql, found)
    page = next(s for s in statements if "'RUNNING'" in s and "LIMIT" in s and "count(" not in s)
    rows = list(database.conn.execute("EXPLAIN QUERY PLAN " + page))
    found = " | ".join(r[-1] for r in rows)
    assert "ix_jobs_user_1_state_1" in found, found
    # The walk is in the page's order: what is sorted, if anything, is the page's own
    # rows read by id (the outer query; docstore's _select), not the user's matches.
    walks = {r[0] for r in rows if "LIST SUBQUERY" in r[-1]}
    assert not [r for r in rows if r[1] in walks and "TEMP B-TREE" in r[-1]], found


async def test_a_dialects_list_total_is_counted_in_an_index_alone(tmp_path: Path) -> None:
    """A dialect's list (OpenPAI's, with its withTotalCount) filters by users, virtual
    clusters and states: its exact total tested them in each match's document (a
    virtual cluster's 83,000 of 1,000,000 jobs: 0.75 s warm, 4.7 s from disk). It is
    counted in an index of copies of those fields, which no page's query names: SQLite
    took an index of the fields themselves for a page too, and sorted every match."""
    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    rng = random.Random(3)
    docs: list[dict[str, Any]] = []
    for i in range(300):
        doc: dict[str, Any] = {
            "_id": f"j{i:03d}", "name": f"n{i}", "submitted_at": T0 + timedelta(seconds=i),
            "dialect": rng.choice(["openpai_v2", "native", "dlc"]), "user": rng.choice("uvw"),
            "queue": rng.choice(["default", "vc-a"]),
            "state": rng.choice(["RUNNING", "FAILED", "QUEUED"]), "tags": ["t"] * (i % 2),
        }  # fmt: skip
        if doc["state"] == "RUNNING" and i % 5 == 0:
            doc["stop_requested_by"] = "u"
        docs.append(doc)
        await views.jobs.insert_one(doc)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)

    def plan(sql: str) -> str:
        return " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))

    openpai = {"dialect": {"$in": ["openpai_v2", "native"]}}
    running = {"state": "RUNNING", "stop_requested_by": None}
    for where, test, copied in [
        (openpai, lambda d: True, True),
        ({**openpai, "queue": {"$in": ["vc-a"]}}, lambda d: d["queue"] == "vc-a", True),
        ({**openpai, "user": {"$in": ["u", "w"]}}, lambda d: d["user"] in "uw", True),
        (
            {**openpai, "$and": [{"$or": [running, {"state": {"$in": ["FAILED"]}}]}]},
            lambda d: (
                d["state"] == "FAILED" or (d["state"] == "RUNNING" and "stop_requested_by" not in d)
            ),
            True,
        ),
        # A filter the copies do not hold (OpenPAI's tags): counted as before.
        ({**openpai, "tags": {"$in": ["t"]}}, lambda d: d["tags"] == ["t"], False),
    ]:
        want = [d["_id"] for d in reversed(docs) if d["dialect"] != "dlc" and test(d)]
        statements.clear()
        items, total = await views.list_jobs(
            user=None, state=None, limit=5, offset=0, where=dict(where)
        )
        assert total == len(want) and [i["id"] for i in items] == want[:5], where
        assert await views.count_jobs(user=None, state=None, where=dict(where)) == len(want)
        counts = [sql for sql in statements if "count(" in sql]
        assert len(counts) == 2, statements
        for sql in counts:
            # The copies' index, and no column but the copies tested (each read in the
            # index: SQLite reads a document only for a column the index lacks).
            found = plan(sql)
            copies = "USING INDEX ix_jobs_dialect:copy_1_user:copy_1_queue:copy_1_state:copy_1"
            assert (copies in found) is copied, found
            assert (re.findall(r"\bf_\w+|json_extract", sql) == []) is copied, sql
        [page] = [sql for sql in statements if "LIMIT" in sql and "count(" not in sql]
        assert "copy" not in plan(page) and "c_" not in page, page


async def test_a_dlc_list_within_its_window_reads_the_users_index_and_counts_copies(
    tmp_path: Path,
) -> None:
    """DLC's ListJobs lists the jobs of a time window (the last 7 days by default). With
    no figures of how many jobs a value holds, SQLite's planner took the dialect's index
    over the user's for a user's list, and read each of the window's DLC jobs for the
    page and again for the total (90 days of 1,000,000 jobs: 178 ms); an admin's by a
    state tested the state in each (147 ms), the whole year 0.6 s. A user's page is
    read in the user's index, and the total counted in an index of copies led by the
    dialect and the submission time; a dialect's window alone in the dialect's index."""
    from trainyard_common.dialects import dlc

    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    rng = random.Random(11)
    docs: list[dict[str, Any]] = []
    with database.transaction():
        for i in range(600):  # one every 5 hours: 125 days
            at = T0 + timedelta(hours=5 * i)
            doc: dict[str, Any] = {
                "_id": f"j{i:03d}", "name": f"n{rng.randrange(1000):03d}",
                "user": rng.choice("uvw"), "dialect": rng.choice(["dlc", "dlc", "native"]),
                "state": rng.choice(["RUNNING", "FAILED", "REJECTED", "SUCCEEDED"]),
                "queue": "default", "submitted_at": at, "finished_at": at + timedelta(hours=1),
            }  # fmt: skip
            docs.append(doc)
            database["jobs"]._insert(doc)
    now = docs[-1]["submitted_at"] + timedelta(minutes=1)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)

    def plan(sql: str) -> str:
        return " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))

    def since(days: int) -> str:
        return (now - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")

    failed = {"FAILED", "REJECTED"}
    user_index = "SEARCH jobs USING INDEX ix_jobs_user_1_submitted_at_m1__id_m1 (f_user=? AND "
    copies = "USING INDEX ix_jobs_dialect:copy_1_submitted_at:copy_1_user:copy_1_state:copy_1 "
    copies += "(c_dialect=? AND c_submitted_at>?)"
    for params, admin, test, page_in, count_in in [
        ({}, False, lambda d: d["user"] == "u" and d["submitted_at"] >= now - timedelta(7),
         user_index, copies),
        ({"StartTime": since(90), "Status": "Failed"}, False,
         lambda d: d["user"] == "u" and d["state"] in failed, user_index, copies),
        ({"StartTime": since(90), "SortBy": "DisplayName", "Order": "asc"}, False,
         lambda d: d["user"] == "u", user_index, copies),
        # A part of a name (fuzzy), tested in each document: the user's index too.
        ({"StartTime": since(90), "DisplayName": "N1"}, False,
         lambda d: d["user"] == "u" and "n1" in d["name"], user_index, user_index),
        # A window of another time: counted in the user's index too.
        ({"StartTime": since(60), "TimeRangeField": "GmtFinishTime"}, False,
         lambda d: d["user"] == "u" and d["finished_at"] >= now - timedelta(60),
         "SEARCH jobs USING INDEX ix_jobs_user_1_submitted_at_m1__id_m1 (f_user=?)",
         "SEARCH jobs USING INDEX ix_jobs_user_1_submitted_at_m1__id_m1 (f_user=?)"),
        ({"StartTime": since(90), "Status": "Failed"}, True, lambda d: d["state"] in failed,
         "", copies),
        ({}, True, lambda d: d["submitted_at"] >= now - timedelta(7), "",
         "SEARCH jobs USING INDEX ix_jobs_dialect_1_submitted_at_m1__id_m1 (f_dialect=? AND"),
    ]:  # fmt: skip
        query = dlc.list_query(params, user="u", admin=admin, now=now)
        window = now - timedelta(days=90 if "StartTime" in params else 7)
        if params.get("TimeRangeField"):
            window = now - timedelta(days=60)
        want = [
            d for d in docs
            if d["dialect"] == "dlc" and test(d)
            and d["finished_at" if "TimeRangeField" in params else "submitted_at"] >= window
        ]  # fmt: skip
        key = (lambda d: (d["name"], d["_id"])) if query.sort == "name" else None
        want.sort(key=key or (lambda d: (d["submitted_at"], d["_id"])), reverse=key is None)
        statements.clear()
        items, total = await views.list_jobs(
            user=None, state=None, limit=5, offset=0, where=query.where, full=True,
            oldest_first=query.ascending, sort=query.sort,
        )  # fmt: skip
        assert len(want) > 5, params
        assert [i["_id"] for i in items] == [d["_id"] for d in want[:5]], params
        assert total == len(want), params
        [count] = [sql for sql in statements if "count(" in sql]
        assert count_in in plan(count), (params, plan(count))
        if count_in == copies:
            # Every column the count tests is in the index (no document read).
            assert re.findall(r"\bf_\w+|json_extract", count) == [], count
        [page] = [sql for sql in statements if "LIMIT" in sql and "count(" not in sql]
        assert page_in in plan(page), (params, plan(page))
    # A user's list with no other filter's index to take: the store's own choice.
    statements.clear()
    items, total = await views.list_jobs(user="u", state=None, limit=5, offset=0)
    assert total == sum(d["user"] == "u" for d in docs) and len(items) == 5
    assert not [sql for sql in statements if "INDEXED BY" in sql], statements


async def views_of(tmp_path: Path, docs: list[dict[str, Any]]) -> tuple[Any, JobViews]:
    """A status store of these jobs, written as they are, with its indexes."""
    database = SqliteClient(tmp_path)["trainyard_status"]
    views = JobViews(database)  # type: ignore[arg-type]
    await views.ensure_indexes()
    with database.transaction():
        for doc in docs:
            database["jobs"]._insert(doc)
    return database, views


async def test_an_openpai_users_list_of_a_virtual_cluster_reads_the_users_index(
    tmp_path: Path,
) -> None:
    """OpenPAI names its users as a list (``{"$in": [user]}``): with one virtual cluster
    beside it, SQLite took the cluster's index and tested the user in each of its jobs
    (1,000,000 jobs: 36-124 ms a page). A list of one user is read as that user's."""
    docs = [
        {
            "_id": f"j{i:03d}", "user": "uvw"[i % 3], "state": "RUNNING",
            "dialect": ["openpai_v2", "native", "dlc"][i % 5 % 3], "queue": f"vc{i % 2}",
            "submitted_at": T0 + timedelta(seconds=i),
        }
        for i in range(120)
    ]  # fmt: skip
    database, views = await views_of(tmp_path, docs)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)
    openpai = {"dialect": {"$in": ["openpai_v2", "native"]}}
    for users, one in [(["u"], True), (["u", "v"], False)]:
        where = {**openpai, "user": {"$in": users}, "queue": {"$in": ["vc1"]}}
        statements.clear()
        items, total = await views.list_jobs(
            user=None, state=None, limit=4, offset=0, where=where, full=True
        )
        want = [
            d["_id"] for d in reversed(docs)
            if d["dialect"] != "dlc" and d["queue"] == "vc1" and d["user"] in users
        ]  # fmt: skip
        assert [i["_id"] for i in items] == want[:4] and total == len(want)
        [page] = [sql for sql in statements if "LIMIT" in sql and "count(" not in sql]
        found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + page))
        # One user: the user's index; two: the store's choice, as before.
        assert ("ix_jobs_user_1_submitted_at_m1__id_m1" in found) is one, found


async def test_a_users_kubernetes_objects_are_read_in_the_users_index(tmp_path: Path) -> None:
    """A Kubernetes-style list (and a watch's first objects) of one user's jobs of a
    dialect: SQLite took the dialect's index and read each of the dialect's jobs (a
    user's 882 of 166,000 Kubeflow jobs: 0.7 s), whole or a page at a time; one job by
    its name as long."""
    docs = [
        {
            "_id": f"j{i:03d}", "user": "uvw"[i % 3], "state": "RUNNING", "claimed": True,
            "dialect": ["kubeflow", "t9k"][i % 2], "dialect_key": f"ml/pytorchjobs/n{i}",
            "submitted_at": T0 + timedelta(seconds=i), "feed_seq": 200 - i,
        }
        for i in range(200)
    ]  # fmt: skip
    database, views = await views_of(tmp_path, docs)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)
    want = [d["_id"] for d in docs if d["user"] == "u" and d["dialect"] == "kubeflow"]
    assert [d["_id"] for d in await views.resources("kubeflow", "u")] == want
    assert [d["_id"] for d in await views.resource_page("kubeflow", "u", 5, None)] == want[:5]
    reads = [sql for sql in statements if sql.startswith("SELECT id, doc")]
    assert len(reads) == 2, statements
    for sql in reads:
        found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX ix_jobs_user_1_submitted_at_m1__id_m1 (f_user=?)" in found, found
    # A watch's changes since its version, at each poll: a walk of those changes alone
    # (SQLite sorted every job of the dialect).
    statements.clear()
    changed = await views.resource_changes("kubeflow", 190)
    newest = sorted((d for d in docs if d["feed_seq"] > 190), key=lambda d: d["feed_seq"])
    want = [d["_id"] for d in newest if d["dialect"] == "kubeflow"]
    assert [d["_id"] for d in changed] == want and want
    [sql] = [sql for sql in statements if sql.startswith("SELECT id, doc")]
    found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert "ix_jobs_dialect_1_feed_seq_1 (f_dialect=? AND f_feed_seq>?)" in found, found
    # One by its name (kubectl get, every dialect's read by name): the index of a user's
    # names, where SQLite took the dialect's for its order (1,000,000 jobs: 0.6 s).
    statements.clear()
    [one] = await views.resources("kubeflow", "u", "ml/pytorchjobs/n6")
    found_by_key = await views.find_by_key("u", "ml/pytorchjobs/n6", dialect="kubeflow")
    assert one["_id"] == "j006" and found_by_key is not None and found_by_key["_id"] == "j006"
    reads = [sql for sql in statements if sql.startswith("SELECT id, doc")]
    assert len(reads) == 2, statements
    for sql in reads:
        found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "ix_jobs_user_1_dialect_key_1 (f_user=? AND f_dialect_key=?)" in found, found


async def test_placements_active_jobs_are_a_search_of_their_states(tmp_path: Path) -> None:
    """A placement leader loads the queued and placed jobs when it takes over: with no
    index, every job ever placed was read, at every start and failover."""
    from trainyard_common.jobspec import JobSpec
    from trainyard_placement.adapters.store import DocJobStore, P

    database = SqliteClient(tmp_path)["trainyard_placement"]
    store = DocJobStore(database["jobs"])  # type: ignore[arg-type]
    await store.ensure_indexes()
    spec = JobSpec.model_validate(
        {"name": "j", "roles": [{"name": "w", "replicas": 1, "command": "true"}]}
    )
    for i in range(6):
        await store.add_queued(f"j{i}", attempt=1, arrival_seq=i, spec=spec)
    for i in range(4):
        assert await store.mark_placed(f"j{i}", [])
        if i < 2:
            assert await store.mark_done(f"j{i}", P.PLACED)
    statements: list[str] = []
    database.conn.set_trace_callback(statements.append)
    assert sorted(r.job_id for r in await store.active()) == ["j2", "j3", "j4", "j5"]
    [sql] = [sql for sql in statements if sql.startswith("SELECT")]
    found = " | ".join(r[-1] for r in database.conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert "USING INDEX ix_jobs_state_1 (f_state=?)" in found, found


async def test_a_count_past_its_time_stops_and_leaves_the_store_as_it_was(
    tmp_path: Path,
) -> None:
    """The store answers on the event loop's thread: a count over a filter no index
    serves (every document's JSON read) stops at ``maxTimeMS``, as MongoDB's does, and
    the connection goes on as before, inside a transaction too."""
    database = SqliteClient(tmp_path)["db"]
    col = database["c"]
    with database.transaction():
        for i in range(60_000):
            col._insert({"_id": f"d{i:06d}", "n": i, "pad": "x" * 200})
    slow = {"n": {"$gte": 0}, "pad": {"$regex": "y"}}
    with database.transaction():
        await col.insert_one({"_id": "inside"})
        with pytest.raises(TimedOut):
            await col.count_documents(slow, maxTimeMS=1)
        assert await count_within(col, slow, 10, 1) is None
        with pytest.raises(TimedOut):  # a query too (pymongo's max_time_ms)
            [d async for d in col.find(slow).sort("n", -1).limit(5).max_time_ms(1)]
        await col.insert_one({"_id": "after"})  # the transaction goes on
    assert await col.count_documents({"_id": {"$in": ["inside", "after"]}}) == 2
    assert await col.count_documents(slow) == 0  # no handler left behind
    assert await col.count_documents({}, limit=100, maxTimeMS=10_000) == 100


async def test_two_processes_sharing_a_file_never_both_win(tmp_path: Path) -> None:
    """Replicas of a service share its file: a conditional update under the write lock
    has one winner, from two connections as from two processes."""
    first = SqliteClient(tmp_path)["db"]["c"]
    second = SqliteClient(tmp_path)["db"]["c"]
    await first.insert_one({"_id": "job", "state": "queued"})
    results = await asyncio.gather(
        *[
            col.update_one({"_id": "job", "state": "queued"}, {"$set": {"state": f"by{i}"}})
            for i, col in enumerate([first, second] * 5)
        ]
    )
    assert sum(r.modified_count for r in results) == 1


async def test_a_savepoint_undoes_its_own_writes_and_the_transaction_goes_on(
    tmp_path: Path,
) -> None:
    database = SqliteClient(tmp_path)["db"]
    col = database["c"]
    other = SqliteClient(tmp_path)["db"]["c"]  # another connection: sees only commits
    with database.transaction():
        with database.savepoint():
            await col.insert_one({"_id": "kept"})
        with pytest.raises(ValueError), database.savepoint():
            await col.insert_one({"_id": "undone"})
            await col.update_one({"_id": "kept"}, {"$set": {"by": "undone"}})
            raise ValueError("a failing message")
        with database.savepoint():
            await col.insert_one({"_id": "after"})
        assert await other.count_documents({}) == 0  # nothing committed yet
    assert sorted([d["_id"] async for d in other.find({})]) == ["after", "kept"]
    assert (await other.find_one({"_id": "kept"})) == {"_id": "kept"}
    # Outside a transaction, a savepoint is a transaction of its own.
    with pytest.raises(ValueError), database.savepoint():
        await col.insert_one({"_id": "alone"})
        raise ValueError("undone too")
    assert await other.count_documents({"_id": "alone"}) == 0
    with database.savepoint():
        await col.insert_one({"_id": "alone"})
    assert await other.count_documents({"_id": "alone"}) == 1


async def test_another_tasks_write_during_an_open_transaction_is_refused(
    tmp_path: Path,
) -> None:
    """One connection per database and process: a write of another task would join the
    open transaction (and be lost with it), so it fails instead."""
    database = SqliteClient(tmp_path)["db"]
    col = database["c"]
    opened, release = asyncio.Event(), asyncio.Event()

    async def batch() -> None:
        with database.transaction():
            await col.insert_one({"_id": "batch"})
            opened.set()
            await release.wait()  # what a batch must never do: wait inside

    task = asyncio.create_task(batch())
    await opened.wait()
    with pytest.raises(RuntimeError, match="another task's transaction"):
        await col.insert_one({"_id": "intruder"})
    release.set()
    await task
    assert [d["_id"] async for d in col.find({})] == ["batch"]


async def test_replicas_declaring_the_same_index_at_once_both_start(tmp_path: Path) -> None:
    """Two replicas open the table, then both declare its indexes: the second finds the
    column the first added (no "duplicate column" at start)."""
    first = SqliteClient(tmp_path)["db"]["c"]
    second = SqliteClient(tmp_path)["db"]["c"]
    await first.create_index([("state", 1)])
    await second.create_index([("state", 1), ("user", 1)])
    await second.insert_one({"_id": "a", "state": "x", "user": "u"})
    assert await first.count_documents({"state": "x", "user": "u"}) == 1


def test_processes_opening_a_new_file_at_once_all_start(tmp_path: Path) -> None:
    """Every service opens the shared auth file as it starts: none may fail to (a full
    run of the suite once saw "database is locked" from the switch to WAL)."""
    code = (
        "import asyncio, sys; from trainyard_common.docstore import SqliteClient\n"
        "async def main():\n"
        "    c = SqliteClient(sys.argv[1])\n"
        "    await c['auth']['tokens'].insert_one({'_id': sys.argv[2]})\n"
        "asyncio.run(main())\n"
    )
    for round_ in range(3):
        directory = tmp_path / f"r{round_}"
        procs = [
            subprocess.Popen([sys.executable, "-c", code, str(directory), str(i)],
                             stderr=subprocess.PIPE)
            for i in range(8)
        ]  # fmt: skip
        errors = [p.communicate()[1].decode() for p in procs if p.wait() != 0]
        assert not errors, errors[0]
        count = asyncio.run(SqliteClient(directory)["auth"]["tokens"].count_documents({}))
        assert count == 8
