"""The stores the services keep their data in, behind one small document API.

- Embedded (the default): SQLite files under ``<data>/store``, one per service
  (``trainyard_common.docstore``): nothing to build or start.
- MongoDB when ``MONGO_URL`` (or ``YARD_MONGO_URL``) is set: PyMongo's native asyncio
  client (Motor is frozen), the production store.

The adapters use only what both give and what MongoDB and FerretDB v1 both support
(DESIGN §7): no transactions, no change streams, no '.'-keys, a few query and update
operators. Idempotency therefore lives inside single documents: unique keys and
conditional updates. A consumer whose handlers write only to its store stores each
fetched batch at once on both (``batch_writes``): one SQLite transaction, or one unit
of work sent to MongoDB as bounded bulk writes (mongo_batch.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, ExecutionTimeout, OperationFailure

from .docstore import (
    DuplicateKey,
    IndexNotFound,
    SqliteClient,
    SqliteCollection,
    SqliteDatabase,
    TimedOut,
)
from .docstore import copy_key as copy_key  # the embedded store's alone (needs_hints)
from .docstore import day_key as day_key
from .docstore import day_text as day_text
from .mongo_batch import BatchedCollection, BatchedDatabase, MongoBatches, batched

# What an adapter is given: a database or a collection of either store.
Database = AsyncDatabase[dict[str, Any]] | SqliteDatabase
Collection = AsyncCollection[dict[str, Any]] | SqliteCollection
Client = AsyncMongoClient[dict[str, Any]] | SqliteClient


# What a query or count past its time limit raises on either store.
TIMEOUTS = (ExecutionTimeout, TimedOut)


def mongo_client(url: str) -> AsyncMongoClient[dict[str, Any]]:
    return AsyncMongoClient(url, tz_aware=True, serverSelectionTimeoutMS=10_000)


def open_store(mongo_url: str | None, store_dir: Path) -> Client:
    """MongoDB at ``mongo_url`` when one is given, else the embedded SQLite store."""
    if mongo_url:
        return mongo_client(mongo_url)
    return SqliteClient(store_dir)


class SqliteBatches:
    """``bus.Atomic`` for the embedded store: a fetched batch is one SQLite
    transaction, each message a savepoint in it."""

    def __init__(self, database: SqliteDatabase) -> None:
        self.database = database

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.database.transaction():
            yield

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        with self.database.savepoint():
            yield


def batching(db: Database) -> Database:
    """``db`` as a consumer that stores each fetched batch at once must use it: on
    MongoDB, a database whose collections join the running batch (mongo_batch.py); the
    embedded store's own database as it is."""
    if isinstance(db, AsyncDatabase) and not isinstance(db, BatchedDatabase):
        return batched(db)
    return db


def batch_writes(db: Database) -> SqliteBatches | MongoBatches:
    """The batches of a database from ``batching`` (``Bus.consume(atomic=...)``)."""
    if isinstance(db, SqliteDatabase):
        return SqliteBatches(db)
    if isinstance(db, BatchedDatabase):
        return MongoBatches(db)
    raise TypeError("batch_writes() takes a database from batching()")


def reads_ahead(db: Database) -> bool:
    """Whether a consumer's batch on ``db`` gains from reading its documents at once
    before its handlers run (``preload``): on MongoDB each read is a round trip; on the
    embedded store an index lookup, and the work of finding the ids would cost more."""
    return isinstance(db, BatchedDatabase)


def needs_hints(collection: Collection) -> bool:
    """Whether a query whose best index depends on the data must name it (``hint``): on
    the embedded store, whose planner keeps no figures of how many documents a range
    holds; MongoDB's tries its candidate plans against each other and keeps the
    fastest."""
    return isinstance(collection, SqliteCollection)


async def preload(collection: Collection, ids: Iterable[Any]) -> None:
    """Inside a consumer's batch on MongoDB, read these documents at once
    (``BatchedCollection.preload``); nothing on the embedded store, whose reads by
    ``_id`` are a local index lookup each."""
    if isinstance(collection, BatchedCollection):
        await collection.preload(ids)


async def drop_old_index(collection: Collection, keys: list[tuple[str, int]]) -> bool:
    """Drop the index ``create_index`` made with these keys, one a service no longer
    declares (each write kept it up to date for nothing); False when it is not there."""
    try:
        await collection.drop_index(keys)
    except IndexNotFound:
        return False
    except OperationFailure as exc:
        if exc.code != 27:  # IndexNotFound
            raise
        return False
    return True


async def insert_once(collection: Collection, document: dict[str, Any]) -> bool:
    """Insert ``document``; False when one with the same ``_id`` is already there."""
    try:
        await collection.insert_one(document)
    except (DuplicateKeyError, DuplicateKey):
        return False
    return True


async def insert_all_once(collection: Collection, documents: list[dict[str, Any]]) -> int:
    """``insert_once`` of each of ``documents`` at once: one transaction on the embedded
    store, one unordered bulk insert on MongoDB (a document already there is left as
    it is); how many were new."""
    if not documents:
        return 0
    if isinstance(collection, SqliteCollection):
        with collection.database.transaction():
            return sum([await insert_once(collection, document) for document in documents])
    try:
        return len((await collection.insert_many(documents, ordered=False)).inserted_ids)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if exc.details.get("writeConcernErrors") or any(e.get("code") != 11000 for e in errors):
            raise
        return int(exc.details.get("nInserted", 0))


async def count_within(
    collection: Collection,
    query: dict[str, Any],
    most: int,
    budget_ms: int,
    hint: list[tuple[str, int]] | None = None,
) -> int | None:
    """How many documents match ``query``, counted up to ``most`` and for at most
    ``budget_ms`` on either store (``hint``: in that index); None when the time ran
    out first."""
    more: dict[str, Any] = {"hint": hint} if hint else {}
    try:
        return int(await collection.count_documents(query, limit=most, maxTimeMS=budget_ms, **more))
    except TIMEOUTS:
        return None
