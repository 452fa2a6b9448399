"""MongoDB plumbing shared by the services: PyMongo's native asyncio client (Motor is
frozen). Stay inside what MongoDB and FerretDB v1 both support (DESIGN §7): no
transactions, no change streams, no '.'-keys. Idempotency therefore lives inside single
documents: unique keys and conditional updates."""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError


def mongo_client(url: str) -> AsyncMongoClient:
    return AsyncMongoClient(url, tz_aware=True, serverSelectionTimeoutMS=10_000)


async def insert_once(collection: AsyncCollection, document: dict[str, Any]) -> bool:
    """Insert ``document``; False when one with the same ``_id`` is already there."""
    try:
        await collection.insert_one(document)
    except DuplicateKeyError:
        return False
    return True
