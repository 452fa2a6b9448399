"""The stores the services keep their data in, behind one small document API.

- Embedded (the default): SQLite files under ``<data>/store``, one per service
  (``trainyard_common.docstore``): nothing to build or start.
- MongoDB when ``MONGO_URL`` (or ``YARD_MONGO_URL``) is set: PyMongo's native asyncio
  client (Motor is frozen), the production store.

The adapters use only what both give and what MongoDB and FerretDB v1 both support
(DESIGN §7): no transactions, no change streams, no '.'-keys, a few query and update
operators. Idempotency therefore lives inside single documents: unique keys and
conditional updates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from .docstore import DuplicateKey, SqliteClient, SqliteCollection, SqliteDatabase

# What an adapter is given: a database or a collection of either store.
Database = AsyncDatabase[dict[str, Any]] | SqliteDatabase
Collection = AsyncCollection[dict[str, Any]] | SqliteCollection
Client = AsyncMongoClient[dict[str, Any]] | SqliteClient


def mongo_client(url: str) -> AsyncMongoClient[dict[str, Any]]:
    return AsyncMongoClient(url, tz_aware=True, serverSelectionTimeoutMS=10_000)


def open_store(mongo_url: str | None, store_dir: Path) -> Client:
    """MongoDB at ``mongo_url`` when one is given, else the embedded SQLite store."""
    if mongo_url:
        return mongo_client(mongo_url)
    return SqliteClient(store_dir)


def batch_transactions(db: Database) -> SqliteDatabase | None:
    """The embedded store's transactions, for a consumer that stores each fetched batch
    at once (``Bus.consume(atomic=...)``); None on MongoDB, where each write stands
    alone as before."""
    return db if isinstance(db, SqliteDatabase) else None


async def insert_once(collection: Collection, document: dict[str, Any]) -> bool:
    """Insert ``document``; False when one with the same ``_id`` is already there."""
    try:
        await collection.insert_one(document)
    except (DuplicateKeyError, DuplicateKey):
        return False
    return True
