"""The unit of work on the MongoDB wire (mongo_batch.py), against the real server
(FerretDB here, MongoDB when MONGO_URL is set): what a batch's reads see, what reaches
the store and when, and what a failed message leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import DeleteOne, InsertOne, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from trainyard_common.docstore import Unsupported
from trainyard_common.mongo_batch import (
    MAX_OPS,
    BatchedDatabase,
    MongoBatches,
    batched,
    inserts_first,
    matches,
)
from trainyard_common.storage import insert_once, mongo_client


@pytest.fixture
async def plain(mongo_url: str, db_prefix: str) -> AsyncIterator[AsyncDatabase[dict[str, Any]]]:
    client = mongo_client(mongo_url)
    yield client[f"{db_prefix}_uow"]
    await client.drop_database(f"{db_prefix}_uow")
    await client.close()


@pytest.fixture
def db(plain: AsyncDatabase[dict[str, Any]]) -> BatchedDatabase:
    return batched(plain)


async def test_a_batch_reads_its_own_writes_and_stores_them_only_at_its_end(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    jobs = db["jobs"]
    await plain["jobs"].insert_one({"_id": "old", "rank": 1, "tags": ["a"]})
    batches = MongoBatches(db)
    seen_elsewhere: list[Any] = []
    asked = asyncio.Event()

    async def http_read() -> None:  # the service's HTTP reads: another task, never inside
        await asked.wait()
        seen_elsewhere.append(await jobs.find_one({"_id": "new"}))

    async def started_inside() -> None:
        await jobs.find_one({"_id": "new"})

    reader = asyncio.create_task(http_read())
    async with batches.transaction():
        assert await insert_once(jobs, {"_id": "new", "rank": 0})
        assert not await insert_once(jobs, {"_id": "new", "rank": 5})  # already written
        await jobs.update_one({"_id": "new", "rank": {"$lt": 2}}, {"$set": {"rank": 2}})
        moved = await jobs.update_one({"_id": "old"}, {"$addToSet": {"tags": "b"}})
        assert moved.matched_count == 1 and moved.modified_count == 1
        assert await jobs.find_one({"_id": "new"}, {"rank": 1}) == {"_id": "new", "rank": 2}
        assert (await jobs.find_one({"_id": "old"}))["tags"] == ["a", "b"]
        asked.set()
        await reader
        with pytest.raises(RuntimeError, match="inside a batch"):
            await asyncio.create_task(started_inside())
        assert await plain["jobs"].find_one({"_id": "new"}) is None  # nothing sent yet
        assert (await plain["jobs"].find_one({"_id": "old"}))["tags"] == ["a"]
    assert seen_elsewhere == [None]
    assert await plain["jobs"].find_one({"_id": "new"}) == {"_id": "new", "rank": 2}
    assert (await plain["jobs"].find_one({"_id": "old"}))["tags"] == ["a", "b"]


async def test_a_guard_that_fails_changes_nothing_in_the_batch_or_the_store(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    await plain["jobs"].insert_one({"_id": "j", "state_rank": 3, "state": "RUNNING"})
    async with MongoBatches(db).transaction():
        result = await db["jobs"].update_one(
            {"_id": "j", "state_rank": {"$lt": 2}}, {"$set": {"state_rank": 2, "state": "QUEUED"}}
        )
        assert result.matched_count == 0
        assert (await db["jobs"].find_one({"_id": "j"}))["state"] == "RUNNING"
        missing = await db["jobs"].update_one({"_id": "none"}, {"$set": {"x": 1}})
        assert missing.matched_count == 0 and await db["jobs"].find_one({"_id": "none"}) is None
        made = await db["jobs"].update_one({"_id": "up"}, {"$set": {"x": 1}}, upsert=True)
        assert made.upserted_id == "up"
    assert (await plain["jobs"].find_one({"_id": "j"}))["state"] == "RUNNING"
    assert await plain["jobs"].find_one({"_id": "none"}) is None
    assert await plain["jobs"].find_one({"_id": "up"}) == {"_id": "up", "x": 1}


async def test_a_failed_message_is_undone_alone(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    batches = MongoBatches(db)
    jobs = db["jobs"]
    await plain["jobs"].insert_one({"_id": "j", "n": 0})
    async with batches.transaction():
        async with batches.savepoint():
            await jobs.update_one({"_id": "j"}, {"$set": {"n": 1}})
        with pytest.raises(RuntimeError):
            async with batches.savepoint():
                await jobs.update_one({"_id": "j"}, {"$set": {"n": 2}})
                await jobs.insert_one({"_id": "k"})
                raise RuntimeError("the handler failed after its writes")
        assert await jobs.find_one({"_id": "j"}) == {"_id": "j", "n": 1}
        assert await jobs.find_one({"_id": "k"}) is None
        async with batches.savepoint():
            await jobs.update_one({"_id": "j"}, {"$inc": {"n": 10}})
    assert await plain["jobs"].find_one({"_id": "j"}) == {"_id": "j", "n": 11}
    assert await plain["jobs"].count_documents({}) == 1


async def test_writes_it_cannot_follow_send_the_queue_first(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    batches = MongoBatches(db)
    tasks = db["tasks"]
    async with batches.transaction():
        for i in range(3):
            await tasks.insert_one({"_id": f"t{i}", "job_id": "j", "state": "RUNNING"})
        with pytest.raises(RuntimeError, match="find"):
            tasks.find({"job_id": "j"})
        # By another filter: the queue goes first, then the update, then the copies
        # are read again.
        await tasks.update_many({"job_id": "j"}, {"$set": {"state": "STOPPED"}})
        assert await plain["tasks"].count_documents({"state": "STOPPED"}) == 3
        assert (await tasks.find_one({"_id": "t1"}))["state"] == "STOPPED"
        await tasks.update_one({"_id": "t1"}, {"$set": {"state": "FAILED"}})
        assert await tasks.count_documents({"state": "FAILED"}) == 1  # sent first
        assert [d["_id"] async for d in tasks.find({"job_id": "j"}).sort("_id")] == [
            "t0",
            "t1",
            "t2",
        ]


async def test_a_batch_larger_than_one_command_is_stored_in_order(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    # FerretDB v1 never answers an update command of 50 statements: the batch is sent
    # MAX_OPS writes a command, each document's writes in the order made.
    writes = 3 * MAX_OPS + 7
    async with MongoBatches(db).transaction():
        await db["c"].insert_one({"_id": "n", "v": 0})
        for v in range(1, writes):
            await db["c"].update_one({"_id": "n", "v": {"$lt": v}}, {"$set": {"v": v}})
            await db["d"].update_one({"_id": f"d{v}"}, {"$set": {"v": v}}, upsert=True)
    assert await plain["c"].find_one({"_id": "n"}) == {"_id": "n", "v": writes - 1}
    assert await plain["d"].count_documents({}) == writes - 1


async def test_an_insert_another_writer_made_first_fails_the_batch(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    # A second status replica made the document after this batch read it as absent:
    # the bulk write fails, the whole batch is redelivered (bus._handle_batch), and its
    # handlers then see that document.
    with pytest.raises(BulkWriteError):
        async with MongoBatches(db).transaction():
            assert await insert_once(db["jobs"], {"_id": "j", "by": "me"})
            await plain["jobs"].insert_one({"_id": "j", "by": "another replica"})
    assert (await plain["jobs"].find_one({"_id": "j"}))["by"] == "another replica"


def test_matches_evaluates_the_filters_the_handlers_write() -> None:
    doc = {"_id": "j", "rank": 3, "state": "RUNNING", "meta": {"attempt": 2}, "tags": ["a"]}
    assert matches(doc, {"_id": "j", "rank": {"$lt": 4}})
    assert not matches(doc, {"_id": "j", "rank": {"$lt": 3}})
    assert matches(doc, {"rank": {"$lte": 3, "$gte": 3}})
    assert matches(doc, {"state": {"$nin": ["SUCCEEDED", "FAILED"]}})
    assert not matches(doc, {"state": {"$in": ["SUCCEEDED"]}})
    assert matches(doc, {"meta.attempt": 2, "missing": None})
    assert not matches(doc, {"missing": {"$ne": None}})
    for query in (
        {"tags": "a"},  # MongoDB matches an array's elements
        {"missing": {"$lt": 1}},  # MongoDB orders by type
        {"state": {"$gt": 1}},
        {"$or": [{"rank": 3}]},
        {"rank": {"$mod": [2, 1]}},
    ):
        with pytest.raises(Unsupported):
            matches(doc, query)


async def test_a_message_failing_after_a_write_sent_early_leaves_only_what_was_sent(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    batches = MongoBatches(db)
    jobs = db["jobs"]
    await plain["jobs"].insert_many([{"_id": "a", "n": 0}, {"_id": "b", "n": 0}])
    async with batches.transaction():
        with pytest.raises(RuntimeError):
            async with batches.savepoint():
                await jobs.update_one({"_id": "a"}, {"$set": {"n": 1}})
                await jobs.update_many({"n": 0}, {"$set": {"seen": True}})  # sends the queue
                await jobs.update_one({"_id": "b"}, {"$set": {"n": 2}})
                raise RuntimeError("the handler failed after its writes")
        # What went out stays (as any write on MongoDB outside a batch); the rest is
        # gone from the batch's copies too, read again from the store.
        assert await jobs.find_one({"_id": "a"}) == {"_id": "a", "n": 1}
        assert await jobs.find_one({"_id": "b"}) == {"_id": "b", "n": 0, "seen": True}
    assert await plain["jobs"].find_one({"_id": "b"}) == {"_id": "b", "n": 0, "seen": True}


def test_inserts_go_first_only_where_they_are_their_documents_first_write() -> None:
    writes = [
        ("a", InsertOne({"_id": "a"})),
        ("a", UpdateOne({"_id": "a"}, {"$set": {"n": 1}})),
        ("b", DeleteOne({"_id": "b"})),
        ("b", InsertOne({"_id": "b"})),  # after its delete: stays there
        ("c", InsertOne({"_id": "c"})),
        ("a", UpdateOne({"_id": "a"}, {"$set": {"n": 2}})),
    ]
    order = inserts_first(writes)  # type: ignore[arg-type]
    assert order == [
        writes[0][1],
        writes[4][1],
        writes[1][1],
        writes[2][1],
        writes[3][1],
        writes[5][1],
    ]


async def test_a_write_sent_early_that_fails_fails_the_whole_batch(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    # The first message's insert goes out with the second message's barrier and fails
    # there: the bus would nak only the second message, so the batch itself must fail
    # (none of it acked), or the first would be acked unstored.
    batches = MongoBatches(db)
    with pytest.raises(RuntimeError, match="not stored"):
        async with batches.transaction():
            async with batches.savepoint():
                assert await insert_once(db["jobs"], {"_id": "j", "by": "me"})
            await plain["jobs"].insert_one({"_id": "j", "by": "another replica"})
            with pytest.raises(BulkWriteError):
                async with batches.savepoint():
                    await db["jobs"].update_many({}, {"$set": {"seen": True}})
            async with batches.savepoint():
                await db["other"].insert_one({"_id": "x"})
    assert await plain["other"].find_one({"_id": "x"}) is None


async def test_the_rest_of_the_api_sends_the_queue_first(
    db: BatchedDatabase, plain: AsyncDatabase[dict[str, Any]]
) -> None:
    c = db["c"]
    async with MongoBatches(db).transaction():
        await c.insert_one({"_id": "a", "kind": "x"})
        assert await c.distinct("kind") == ["x"]  # the queued insert went first
        await c.update_one({"_id": "a"}, {"$set": {"kind": "y"}})
        await c.find_one_and_update({"_id": "a"}, {"$set": {"kind": "z"}})
        assert (await c.find_one({"_id": "a"}))["kind"] == "z"  # read again, not the copy
        await c.insert_many([{"_id": "b"}, {"_id": "c"}])
        await c.delete_many({"_id": {"$in": ["b"]}})
        assert await c.estimated_document_count() == 2
    assert sorted([d["_id"] async for d in plain["c"].find({})]) == ["a", "c"]
